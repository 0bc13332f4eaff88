"""llama.cpp's output goes to a log file, not the console (heart/runtime/llamacpp_log.py).

- the log file is ``$HEART_LOG_FILE``, else ``<$HEART_CACHE>/logs/heart.log``;
- a peft → GGUF conversion's output lands in the log under a header, the console gets one
  line saying where; a conversion that fails raises with the last lines of its output;
  ``HEART_VERBOSE=1`` shows the output on the console instead;
- llama.cpp's own log (through ``llama_log_set``) lands in the log, its errors on stderr too.

The converter here is a stand-in script (``HEART_LLAMA_CPP_TOOLS``): what is tested is where
its output goes, not llama.cpp's conversion (tests/integration/test_llamacpp.py runs that).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
import textwrap

import pytest

from heart.runtime import gguf_files, llamacpp_log


@pytest.fixture
def fresh_log(monkeypatch, tmp_path):
    """The module's per-process state reset, and HEART_LOG_FILE / HEART_CACHE under tmp_path."""
    monkeypatch.setattr(llamacpp_log, "_log", None)
    monkeypatch.setattr(llamacpp_log, "_announced", set())
    monkeypatch.setattr(llamacpp_log, "_to_console", False)
    monkeypatch.delenv(llamacpp_log.VERBOSE_ENV, raising=False)
    monkeypatch.setenv("HEART_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "run" / "heart.log"
    monkeypatch.setenv(llamacpp_log.LOG_FILE_ENV, str(path))
    yield path
    if llamacpp_log._log is not None:
        llamacpp_log._log[1].close()


def test_the_log_file_is_the_env_var_else_under_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HEART_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(llamacpp_log.LOG_FILE_ENV, raising=False)
    assert llamacpp_log.log_path() == tmp_path / "cache" / "logs" / "heart.log"
    monkeypatch.setenv(llamacpp_log.LOG_FILE_ENV, str(tmp_path / "run" / "pipeline.log"))
    assert llamacpp_log.log_path() == tmp_path / "run" / "pipeline.log"
    for value, expected in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv(llamacpp_log.VERBOSE_ENV, value)
        assert llamacpp_log.verbose() is expected


def _converter(tmp_path, monkeypatch, lines: int, status: int):
    """A stand-in convert_lora_to_gguf.py printing ``lines`` numbered lines (both streams),
    writing --outfile when it succeeds; and one adapter folder to convert."""
    tools = tmp_path / "tools"
    tools.mkdir(parents=True)
    (tools / "convert_lora_to_gguf.py").write_text(textwrap.dedent(f"""\
        import sys
        out = sys.argv[sys.argv.index("--outfile") + 1]
        for i in range({lines}):
            print(f"INFO:lora-to-gguf:line {{i}}", file=sys.stderr if i % 2 else sys.stdout)
        if {status} == 0:
            open(out, "wb").write(b"GGUF")
        sys.exit({status})
        """))
    monkeypatch.setenv(gguf_files.CONVERTER_ENV, str(tools))
    adapter = tmp_path / "adapters" / "planner"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "seed": lines}))
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    return {"planner": str(adapter)}


def test_a_conversion_writes_its_output_to_the_log_not_the_console(fresh_log, tmp_path, monkeypatch, capfd):
    adapters = _converter(tmp_path, monkeypatch, lines=270, status=0)
    files = gguf_files.lora_ggufs(adapters, tmp_path / "base")
    assert files["planner"].read_bytes() == b"GGUF"
    out, err = capfd.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [f"heart: llama.cpp's output goes to {fresh_log} (HEART_VERBOSE=1 shows it here)"]
    log = fresh_log.read_text().splitlines()
    assert log[0].startswith("== ") and "convert_lora_to_gguf.py: the planner adapter" in log[0]
    assert "(exit status 0)" in log[0]
    assert sorted(log[1:]) == sorted(f"INFO:lora-to-gguf:line {i}" for i in range(270))


def test_a_failed_conversion_raises_with_the_tail_of_its_output(fresh_log, tmp_path, monkeypatch, capfd):
    adapters = _converter(tmp_path, monkeypatch, lines=300, status=3)
    with pytest.raises(RuntimeError) as err:
        gguf_files.lora_ggufs(adapters, tmp_path / "base")
    message = str(err.value)
    assert "converting the planner adapter" in message and "(exit status 3)" in message
    assert str(fresh_log) in message
    tail = message.splitlines()[-llamacpp_log.TAIL_LINES:]
    assert len(tail) == llamacpp_log.TAIL_LINES and all(line.startswith("INFO:lora-to-gguf:line 2") for line in tail)
    assert "line 0" not in message
    assert "(exit status 3)" in fresh_log.read_text()
    assert not list((tmp_path / "cache" / "gguf").glob("*.gguf"))  # nothing half-written published
    assert "INFO:lora-to-gguf" not in capfd.readouterr().err


def test_verbose_keeps_the_output_on_the_console(fresh_log, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(llamacpp_log.VERBOSE_ENV, "1")
    adapters = _converter(tmp_path, monkeypatch, lines=10, status=0)
    gguf_files.lora_ggufs(adapters, tmp_path / "base")
    err = capfd.readouterr().err
    assert "INFO:lora-to-gguf:line 9" in err and "goes to" not in err
    assert not fresh_log.exists()
    with pytest.raises(RuntimeError, match="all of it in the console above"):
        gguf_files.lora_ggufs(_converter(tmp_path / "again", monkeypatch, lines=5, status=1), tmp_path / "base")


def test_llama_cpps_own_log_goes_to_the_file_and_its_errors_to_stderr_too(fresh_log, capfd):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is built by scripts/setup.sh")
    assert llamacpp_log.route_llama_cpp() == fresh_log
    capfd.readouterr()
    model = llama_cpp.llama_model_load_from_file(str(fresh_log.parent / "missing.gguf").encode(),
                                                 llama_cpp.llama_model_default_params())
    assert model is None
    err = capfd.readouterr().err
    log = fresh_log.read_text()
    assert "missing.gguf" in log and "failed to load model" in log
    assert "failed to load model" in err  # an error: on the console as well
    llamacpp_log._on_log(2, b"print_info: an INFO line\n", None)
    llamacpp_log._on_log(1, b"llama_graph: a DEBUG line\n", None)
    llamacpp_log._on_log(5, b"its continuation\n", None)
    log = fresh_log.read_text()
    assert "an INFO line" in log and "DEBUG" not in log and "its continuation" not in log
    assert capfd.readouterr().err == ""


def test_a_log_its_parent_already_named_is_not_announced_again(fresh_log, tmp_path, monkeypatch, capfd):
    """``heart pipeline`` names its run folder's log once; its stages' processes stay quiet about it."""
    monkeypatch.setenv(llamacpp_log.NAMED_ENV, str(fresh_log))
    files = gguf_files.lora_ggufs(_converter(tmp_path, monkeypatch, lines=3, status=0), tmp_path / "base")
    assert files["planner"].read_bytes() == b"GGUF"
    assert capfd.readouterr() == ("", "")
    assert "INFO:lora-to-gguf:line 2" in fresh_log.read_text()


def test_a_child_processs_chatter_goes_to_the_log_file_unless_verbose(fresh_log, monkeypatch):
    """An MCP server's stderr (heart.environments.mcp) takes llamacpp_log.stream()."""
    monkeypatch.delenv(llamacpp_log.VERBOSE_ENV, raising=False)
    assert Path(llamacpp_log.stream().name) == fresh_log
    monkeypatch.setenv(llamacpp_log.VERBOSE_ENV, "1")
    assert llamacpp_log.stream() is sys.stderr
