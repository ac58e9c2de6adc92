"""Tensors in snapshots: each writer reads only its own byte ranges of a tensor, and a
tensor off the host (here one read through the device path, on the CPU) gives the same
bytes as one read in place."""

from __future__ import annotations

from typing import Any

import torch

from elastic.snapshots import codec
from elastic.torch.snapshot_codec import DeviceBytes


def test_a_device_tensor_is_read_a_range_at_a_time_with_the_same_bytes():
    tensor = torch.arange(1000, dtype=torch.float32)
    whole = tensor.view(torch.uint8).numpy().tobytes()
    device = DeviceBytes(tensor)
    assert device.nbytes == len(whole)
    # Ranges that start and stop inside an element, and one of every byte.
    for start, stop in ((0, 4000), (3, 17), (1, 2), (3998, 4000), (2001, 3333)):
        assert bytes(device.read(start, stop)) == whole[start:stop]


def test_a_state_of_tensors_splits_and_joins_without_copying_it_whole():
    state: dict[str, Any] = {"w": torch.randn(300, 100), "step": 7, "small": torch.ones(3)}
    skeleton, leaves = codec.split(state)
    assert [leaf.kind for leaf in leaves] == ["torch"]  # the small one stays inside
    buffers = [bytearray(leaf.data.read(0, leaf.nbytes)) for leaf in leaves]
    back = codec.join(skeleton, ["torch"], [leaves[0].meta], buffers)
    assert torch.equal(back["w"], state["w"]) and back["step"] == 7
    assert torch.equal(back["small"], state["small"])
