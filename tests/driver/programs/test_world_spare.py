"""A warm spare of restart mode (``driver.programs.world_spare``): what it takes for a Python
program (``driver.programs.python_command``, pure), then a real spare process against a
real embedded store: it imports what the program imports, registers, waits for its
seat, and runs the program in its own process as ``python`` would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from driver.programs import python_command, world_spare
from driver.programs.python_command import PythonProgram, python_program
from rendezvous import open_store
from rendezvous.keys import JobKeys
from rendezvous.schema.workers import WorkerInfo
from rendezvous.schema.worlds import WorldSeat
from tests.support.jobs import wait_until
from tests.support.paths import ROOT


@pytest.mark.unit
def test_plain_python_commands_are_programs_and_the_rest_is_not():
    assert python_program(["python", "t.py", "--lr", "1"]) == PythonProgram(
        "python", "t.py", False, ("--lr", "1")
    )
    assert python_program(["/opt/bin/python3.11", "-m", "pkg.train"]) == PythonProgram(
        "/opt/bin/python3.11", "pkg.train", True, ()
    )
    for command in (["python"], ["python", "-u", "t.py"], ["python", "-m"], ["bash", "t.py"]):
        assert python_program(command) is None, command


@pytest.mark.unit
def test_the_top_level_imports_are_read_from_the_source_without_running_it():
    source = (
        "from __future__ import annotations\nimport os, torch.nn as nn\n"
        "from numpy import array\nfrom . import sibling\n"
        "try:\n    import yaml\nexcept ImportError:\n    yaml = None\n"
        "def main():\n    import inside_a_function\n"
        "if __name__ == '__main__':\n    import json\n"
    )
    assert python_command.top_imports(source) == ["os", "torch.nn", "numpy", "yaml", "json"]
    assert python_command.top_imports("def (:") == []


@pytest.mark.unit
def test_the_same_interpreter_is_the_same_file_in_the_same_folder(tmp_path):
    link = tmp_path / "python"
    link.symlink_to(os.path.realpath(sys.executable))
    assert python_command.same_interpreter(sys.executable, sys.executable)
    assert not python_command.same_interpreter(str(link), sys.executable)  # another env
    assert not python_command.same_interpreter(None, sys.executable)


def test_a_spare_preloads_registers_waits_then_runs_the_program_in_its_seat(
    embedded_server, tmp_path
):
    """The spare's program finds the module it imports already loaded (but its own
    local module, which runs once, in its seat), ``python``'s argv and path, rank 0's
    address and none of the job's wiring, in the same process; its exit code is the
    program's, and its registration is gone once it runs."""
    (tmp_path / "local_part.py").write_text("import sys\nsys.stdout.write('local ran\\n')\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "preloaded = 'xml.dom.minidom' in sys.modules and 'local_part' not in sys.modules\n"
        "import json, os\nimport xml.dom.minidom\nimport local_part\n"
        "print(json.dumps({'pid': os.getpid(), 'argv': sys.argv, 'path0': sys.path[0],\n"
        "    'preloaded': preloaded, 'name': __name__, 'env': dict(os.environ)}))\n"
        "sys.exit(3)\n"
    )
    url, secret = f"embedded://{embedded_server.address}", embedded_server.secret
    keys = JobKeys("job-s")
    wiring = {
        "ELASTIC_RENDEZVOUS": url,
        "ELASTIC_JOB_SECRET": secret,
        "ELASTIC_JOB_ID": "job-s",
        "ELASTIC_WORKER_ID": "h-s0-1",
        "ELASTIC_HOST": "localhost",
        "ELASTIC_SLOT": "0",
        "ELASTIC_BIND_HOST": "127.0.0.1",
        "ELASTIC_SPARE": "1",
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "driver.programs.world_spare", "--", sys.executable]
    spare = subprocess.Popen(
        [*argv, str(script), "--lr", "1"],
        env={**os.environ, **wiring},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with open_store(url, secret) as store:
            wait_until(lambda: store.get(keys.worker("h-s0-1")) is not None, 30, "registration")
            kv = store.get(keys.worker("h-s0-1"))
            assert kv is not None and WorkerInfo.from_json(kv.value).pid == spare.pid
            seat = {
                "ELASTIC_SLOT": "1",
                "ELASTIC_WORLD": "4",
                "ELASTIC_ROUND_TIMEOUT": "20",
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_WORLD_SIZE": "1",
            }
            store.put(keys.world_seat("h-s0-1"), WorldSeat(4, seat).to_json())
            out, err = spare.communicate(timeout=60)
            assert store.get(keys.worker("h-s0-1")) is None
    finally:
        spare.kill()
        spare.wait(10)
    assert spare.returncode == 3, err
    assert out.startswith("local ran\n")
    seen = json.loads(out.splitlines()[1])
    assert seen["pid"] == spare.pid and seen["preloaded"] and seen["name"] == "__main__"
    assert seen["argv"] == [str(script), "--lr", "1"] and seen["path0"] == str(tmp_path)
    assert seen["env"]["RANK"] == "0" and seen["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert not [k for k in seen["env"] if k.startswith("ELASTIC_")]


@pytest.mark.unit
def test_a_program_of_another_interpreter_is_not_run_warm(tmp_path):
    assert world_spare.warm_program(["python", "t.py"], {"PATH": str(tmp_path)}) is None
    here = os.path.dirname(sys.executable)
    name = os.path.basename(sys.executable)
    assert world_spare.warm_program([name, "t.py"], {"PATH": here}) is not None
