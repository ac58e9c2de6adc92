"""Pure parts of ``elastic.horovod``: Horovod's names and what each maps to (reductions,
compressors, the optimizer's options), refused where there is no equivalent, before
anything touches a world."""

from __future__ import annotations

import pytest
import torch

import elastic.horovod as hvd
from elastic.horovod.compression import Compressor, reducer_compression
from elastic.horovod.ops import op_name

pytestmark = pytest.mark.unit  # pure logic: no process, no socket

#: the worker API of horovod.torch as Horovod's elastic PyTorch examples and docs use it
HOROVOD_NAMES = {
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "allreduce", "allreduce_", "allgather", "broadcast", "broadcast_",
    "broadcast_object", "allgather_object", "barrier", "broadcast_parameters",
    "broadcast_optimizer_state", "DistributedOptimizer", "Compression", "Average", "Sum",
    "Adasum", "Min", "Max", "Product", "elastic", "HorovodInternalError",
    "HostsUpdatedInterrupt",
}  # fmt: skip


def test_the_face_has_horovods_names_and_each_resolves():
    assert set(hvd.__all__) >= HOROVOD_NAMES
    assert all(getattr(hvd, name, None) is not None for name in hvd.__all__)
    for name in ("run", "TorchState", "ObjectState", "ElasticSampler"):
        assert getattr(hvd.elastic, name) is not None
    assert hvd.elastic.HorovodInternalError is hvd.HorovodInternalError


def test_the_elastic_signals_are_the_runtimes_own():
    import elastic

    assert hvd.HorovodInternalError is elastic.WorkerLostError
    assert hvd.HostsUpdatedInterrupt is elastic.HostsUpdatedInterrupt
    assert issubclass(hvd.HorovodUnsupportedError, (elastic.ElasticError, NotImplementedError))


@pytest.mark.parametrize(
    "op, name",
    [
        (None, "average"),
        (hvd.Average, "average"),
        (hvd.Sum, "sum"),
        (hvd.Min, "min"),
        (hvd.Max, "max"),
    ],
)
def test_reductions_map_to_our_ops(op, name):
    assert op_name(op) == name


def test_the_older_average_argument_and_its_conflict_with_op():
    assert op_name(average=True) == "average"
    assert op_name(average=False) == "sum"
    with pytest.raises(ValueError, match="not both"):
        op_name(hvd.Sum, average=True)
    with pytest.raises(TypeError, match=r"hvd\.Average"):
        op_name("sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("op", [hvd.Adasum, hvd.Product])
def test_adasum_and_product_are_refused_in_one_line(op):
    with pytest.raises(hvd.HorovodUnsupportedError) as caught:
        op_name(op)
    message = str(caught.value)
    assert "\n" not in message and f"{op!r} is not supported by elastic.horovod" in message
    assert repr(hvd.Adasum) == "hvd.Adasum"


def test_distributed_optimizer_refuses_adasum_before_touching_a_world():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(hvd.HorovodUnsupportedError, match=r"hvd\.Adasum is not supported"):
        hvd.DistributedOptimizer(optimizer, model.named_parameters(), op=hvd.Adasum)
    with pytest.raises(hvd.HorovodUnsupportedError, match=r"averaged .* or summed"):
        hvd.DistributedOptimizer(optimizer, model.named_parameters(), op=hvd.Max)
    with pytest.raises(hvd.HorovodUnsupportedError, match="sparse"):
        hvd.DistributedOptimizer(optimizer, sparse_as_dense=True)
    with pytest.raises(ValueError, match=r"needs op=hvd\.Average"):
        hvd.DistributedOptimizer(optimizer, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="positive"):
        hvd.DistributedOptimizer(optimizer, gradient_predivide_factor=0.0)
    assert not hasattr(optimizer, "synchronize")  # every refusal left it as it was


def test_fp16_compression_round_trip():
    x = torch.tensor([1 / 3, -2.5, 65504.0, 1e-3], dtype=torch.float32)
    sent, ctx = hvd.Compression.fp16.compress(x)
    assert sent.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == torch.float32
    assert torch.allclose(back, x, rtol=1e-3, atol=0)
    assert back[1] == -2.5 and back[2] == 65504.0  # exact where float16 is
    doubles = torch.tensor([0.1], dtype=torch.float64)
    sent, ctx = hvd.Compression.fp16.compress(doubles)
    assert hvd.Compression.fp16.decompress(sent, ctx).dtype == torch.float64
    ints = torch.tensor([1, 2, 3])
    sent, ctx = hvd.Compression.fp16.compress(ints)
    assert sent is ints and hvd.Compression.fp16.decompress(sent, ctx) is ints
    sent, ctx = hvd.Compression.none.compress(x)
    assert sent is x and hvd.Compression.none.decompress(sent, ctx) is x


def test_the_optimizer_takes_horovods_two_compressors_by_name_only():
    assert reducer_compression(hvd.Compression.none) is None
    assert reducer_compression(hvd.Compression.fp16) == "fp16"

    class Mine(Compressor):
        pass

    with pytest.raises(hvd.HorovodUnsupportedError, match=r"'Mine'.*none and .*fp16"):
        reducer_compression(Mine)


def test_init_refuses_a_communicator_or_process_sets():
    with pytest.raises(hvd.HorovodUnsupportedError, match="whole job"):
        hvd.init(comm=[0, 1])
