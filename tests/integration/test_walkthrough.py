"""README's "Using it locally" walkthrough, run as written against the real llama-server.

The block between ``<!-- walkthrough:begin -->`` and ``<!-- walkthrough:end -->`` is run
by ``bash -e -x`` (stop at the first failing line; trace every command, so each line's
output can be told apart) with only two things changed: its ports 8080, 8081 and 8082
become free ones, and it runs in a temporary directory holding a ``.venv`` link to this
checkout's, where its relative paths resolve as in the checkout's root. Every command is
the real one: llama-server started by `slogate llama-server`, a full calibration, the
sidecar as a process, curl. Then each step's effect is checked, and that nothing it
started is left running. When the README's commands stop working, this fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ports import free_ports
from slogate_admission.schema import CalibrationProfile, Thresholds
from slogate_calibration.runtime import LlamaRuntime

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BEGIN, END = "<!-- walkthrough:begin -->", "<!-- walkthrough:end -->"
README_PORTS = ("8080", "8081", "8082")  # llama-server, the gate's clients, its admin API
TIMEOUT_S = 600.0  # a full calibration (about a minute here) with room for a slow machine


def walkthrough() -> str:
    """The README's walkthrough block, without its code fence."""
    text = README.read_text()
    assert (text.count(BEGIN), text.count(END)) == (1, 1), f"README.md needs one {BEGIN} ... {END} block"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block.startswith("```sh\n"), "the walkthrough is one ```sh block"
    assert block.endswith("\n```"), "the walkthrough is one ```sh block"
    return block.removeprefix("```sh\n").removesuffix("```")


def on_ports(script: str, ports: list[int]) -> str:
    """The script with the README's ports replaced, in one pass (a new port may contain an old one)."""
    for old in README_PORTS:
        assert re.search(rf"\b{old}\b", script), f"the walkthrough no longer uses port {old}: update this test"
    mapping = dict(zip(README_PORTS, map(str, ports), strict=True))
    return re.sub(r"\b(808[012])\b", lambda m: mapping[m.group(1)], script)


def steps(output: str) -> list[tuple[str, str]]:
    """(traced command, what it printed) for each command, in order, from ``bash -x``'s output."""
    found: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        if re.match(r"^\++ ", line):
            found.append((line, []))
        elif found:
            found[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in found]


def printed_by(all_steps: list[tuple[str, str]], *fragments: str) -> str:
    """What the one traced top-level command containing every fragment printed."""
    matching = [out for command, out in all_steps if command.startswith("+ ") and all(f in command for f in fragments)]
    assert len(matching) == 1, f"{fragments}: {len(matching)} matching commands"
    return matching[0]


def stop_group(pgid: int) -> None:
    """SIGTERM what is left of the walkthrough's process group, SIGKILL it 10 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        for _ in range(100):
            time.sleep(0.1)
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_readme_walkthrough_runs_top_to_bottom(llama_runtime: LlamaRuntime, tmp_path: Path) -> None:
    # llama_runtime: without `make llama`'s binary and model this fails at once, with the reason.
    ports = free_ports(3)
    llama_port, gate_port, admin_port = ports
    script = on_ports(walkthrough(), ports)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-e", "-x", "-c", script],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"}, start_new_session=True,  # its own group: all of it can be stopped
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid)
        output, _ = proc.communicate()
        pytest.fail(f"the walkthrough did not end within {TIMEOUT_S:g} s:\n{output}", pytrace=False)
    finally:
        # Nothing the walkthrough started may outlive it: its last line stops and waits for
        # both servers, so the group is already empty unless a line failed.
        try:
            os.killpg(proc.pid, 0)
            left_over = True
        except ProcessLookupError:
            left_over = False
        stop_group(proc.pid)
    elapsed = time.monotonic() - started
    logs = {name: (tmp_path / name).read_text() for name in ("llama-server.log", "sidecar.log")}
    context = (
        f"{output}\n--- llama-server.log (tail):\n{logs['llama-server.log'][-3000:]}\n--- sidecar.log:\n"
        + (logs["sidecar.log"][-3000:])
    )
    assert proc.returncode == 0, f"the walkthrough failed (exit {proc.returncode}) after {elapsed:.0f} s:\n{context}"
    assert not left_over, f"processes of the walkthrough were still running after it ended:\n{context}"
    assert not any(listening(port) for port in ports), context
    all_steps = steps(output)

    # llama-server: the command `slogate llama-server` printed is what ran, with up's settings.
    command = logs["llama-server.log"].splitlines()[0]
    assert command.startswith(str(llama_runtime.server)), command
    assert f"--port {llama_port} " in command
    assert "--threads 2 --parallel 4 --ctx-size 8192" in command

    # calibrate and derive: a valid profile; thresholds from it, then new ones.
    profile = CalibrationProfile.model_validate_json((tmp_path / "profile.json").read_text())
    first = Thresholds.model_validate_json((tmp_path / "thresholds.json").read_text())
    pushed = Thresholds.model_validate_json((tmp_path / "thresholds-5s.json").read_text())
    assert first.calibration_id == pushed.calibration_id == profile.id
    assert [c.name for c in first.classes] == [c.name for c in pushed.classes] == ["interactive", "batch"]
    assert (first.classes[1].ttft_slo_seconds, pushed.classes[1].ttft_slo_seconds) == (10, 5)
    assert len((tmp_path / "admin-token").read_text().strip()) >= 32

    # One request through the gate: 200, admitted in the class it asked for.
    answer = printed_by(all_steps, "curl", f":{gate_port}/v1/chat/completions")
    head, _, body = answer.partition("\n\n")
    assert head.splitlines()[0].startswith("HTTP/1.1 200"), answer
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head.splitlines()[1:])}
    assert headers.get("x-slogate-class") == "interactive", answer
    assert json.loads(body)["choices"][0]["message"]["content"], answer
    assert "POST /v1/chat/completions 200 class=interactive outcome=admit" in logs["sidecar.log"]
    # With a token file: no warning that pushes are refused.
    assert "refuses every threshold push" not in logs["sidecar.log"]

    # The push: 200, and the state shows the pushed thresholds in force.
    assert json.loads(printed_by(all_steps, "curl", "-X PUT", f":{admin_port}/slogate/v1/thresholds")) == {
        "applied": True,
        "calibrationId": profile.id,
    }
    state = json.loads(printed_by(all_steps, "curl", f":{admin_port}/slogate/v1/state"))
    assert state["calibrationId"] == profile.id
    assert Thresholds.model_validate(state["thresholds"]) == pushed
    assert "applied by admin push" in logs["sidecar.log"]

    # simulate: its table, llama-server alone and gated at each load.
    table = printed_by(all_steps, "slogate simulate")
    assert "TTFT SLO 2 s" in table, table
    assert "goodput" in table, table
    rows = [[cell.strip() for cell in line.split("│")[1:3]] for line in table.splitlines() if line.startswith("│")]
    loads = ["0.5x", "1x", "2x", "4x"]
    assert rows == [[gate, load] for gate in ("direct", "slogate") for load in loads], table
