"""heart.runtime.backends.backend_for: every model string, one way to its backend.

Each spec form resolves to its kind of backend (the gold teacher and an OpenAI backend are
built for real: neither loads weights nor opens a connection; the in-process engines are
fakes that record what they were asked to load). A bad spec, engine or load failure is a
UserError that names it. Then the call sites: ``heart run``, ``heart collect``'s teachers,
``heart eval``'s shared backend and ``heart serve`` all reach the same function, and one
``heart run`` reads the library and parses ``--adapter`` once.
"""

from __future__ import annotations

import argparse
import json

import pytest

import heart.runtime.backends as backends
from heart.runtime.backends import backend_for, built_per_task, parse_model_spec
from heart.user_errors import UserError

URL = "http://127.0.0.1:9/v1"


class Loaded:
    """What a fake in-process engine was asked to load."""

    def __init__(self, engine, model, adapters, max_batch_size, **options):
        self.engine, self.model, self.adapters = engine, model, adapters
        self.max_batch_size, self.options = max_batch_size, options
        self.name = f"fake:{model}"


@pytest.fixture
def loads(monkeypatch) -> list[Loaded]:
    """The in-process engines, faked: each load is recorded instead of reading weights."""
    loaded: list[Loaded] = []

    def local_backend(engine, model, adapters=None, max_batch_size=8, **options):
        loaded.append(Loaded(engine, model, adapters, max_batch_size, **options))
        return loaded[-1]

    monkeypatch.setattr(backends, "local_backend", local_backend)
    return loaded


@pytest.fixture(scope="module")
def bfcl():
    from heart.environments import load_environment

    return load_environment("bfcl")


# -- the spec forms ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec,kind,model", [
    ("gold", "gold", None),
    (" gold ", "gold", None),
    (f"openai:{URL}#role", "openai", "role"),
    ("hf:nobody/some-model", "hf", "nobody/some-model"),
    ("smollm2-135m", "hf", "smollm2-135m"),
    ("/models/local-folder", "hf", "/models/local-folder"),
    ("Qwen/Qwen3-8B", "hf", "Qwen/Qwen3-8B"),
])
def test_each_spec_form_parses_to_its_kind(spec, kind, model):
    parsed = parse_model_spec(spec)
    assert (parsed.kind, parsed.model) == (kind, model)
    assert built_per_task(spec) == (kind == "gold")


def test_gold_is_built_per_task_by_the_commands_that_run_tasks_not_by_backend_for(bfcl):
    from heart_distill.data.gold_teacher import GoldTeacher
    from heart_distill.data.teachers import TeacherFactory

    task = bfcl.load_task("multi_turn_base_0")
    with pytest.raises(UserError, match="'gold'.*built per task"):
        backend_for("gold", task=task, tools=bfcl.catalog())
    teacher = TeacherFactory("gold", 0.5, bfcl)(task, seed=3)
    assert isinstance(teacher, GoldTeacher) and teacher.name == "gold+faults0.5"


def test_gold_without_a_task_says_it_is_built_per_task():
    with pytest.raises(UserError, match="'gold'.*built per task"):
        backend_for("gold")


def test_openai_is_an_openai_backend_on_that_server():
    from heart.runtime.openai_compat import OpenAIBackend

    backend = backend_for(f"openai:{URL}#planner=p,default=b", timeout_s=5.0)
    assert isinstance(backend, OpenAIBackend)
    assert (backend.base_url, backend.model, backend.timeout_s) == (URL, {"planner": "p", "default": "b"}, 5.0)


@pytest.mark.parametrize("spec", ["smollm2-135m", "hf:smollm2-135m"])
@pytest.mark.parametrize("engine", ["peft", "llamacpp", "llamacpp:f16"])
def test_a_model_name_or_hf_prefix_loads_in_process_on_the_engine(loads, spec, engine):
    backend = backend_for(spec, {"planner": "runs/a/planner"}, engine, max_batch_size=4)
    assert backend is loads[-1]
    assert (backend.engine, backend.model, backend.adapters, backend.max_batch_size) == (
        engine, "smollm2-135m", {"planner": "runs/a/planner"}, 4)


def test_vllm_gets_the_model_and_adapters_and_batches_for_itself(monkeypatch):
    import heart.runtime.vllm_engine as vllm_engine

    started = []

    class FakeVLLM:
        def __init__(self, model, adapters=None, **options):
            started.append((model, adapters, options))

    monkeypatch.setattr(vllm_engine, "VLLMBackend", FakeVLLM)
    assert isinstance(backend_for("tiny-qwen3", {"router": "r"}, "vllm", max_batch_size=16), FakeVLLM)
    assert started == [("tiny-qwen3", {"router": "r"}, {})]  # no max_batch_size: vLLM has no such argument


def test_quantize_reaches_peft_only(loads):
    backend_for("smollm2-135m", quantize="int8")
    assert loads[-1].options == {"quantize": "int8"}
    backend_for("smollm2-135m")
    assert loads[-1].options == {}  # quantize=None is not an option the engine sees
    with pytest.raises(UserError, match="peft-engine option; the engine is llamacpp"):
        backend_for("smollm2-135m", engine="llamacpp", quantize="int8")


# -- bad input: a UserError naming it ---------------------------------------------------------

@pytest.mark.parametrize("spec", ["openai:foo", "openai:#model", "openai:ftp://h/v1#m", "hf:", ""])
def test_a_malformed_spec_is_named(spec):
    with pytest.raises(UserError) as err:
        backend_for(spec)
    assert (repr(spec) if spec else "no model named") in str(err.value)


def test_an_unknown_engine_is_named(loads):
    with pytest.raises(UserError, match="'tensorrt'"):
        backend_for("smollm2-135m", engine="tensorrt")
    assert not loads


@pytest.mark.parametrize("spec,what", [("gold", "gold teacher"), (f"openai:{URL}#role", "OpenAI-compatible")])
def test_adapters_for_a_model_that_cannot_take_them_are_refused(spec, what):
    with pytest.raises(UserError, match=what) as err:
        backend_for(spec, {"planner": "runs/a/planner"})
    assert "runs/a/planner" in str(err.value)


@pytest.mark.parametrize("raised,expected", [
    (FileNotFoundError("adapter for role 'planner': no adapter_config.json in /x"), "no adapter_config.json in /x"),
    (OSError("nobody/m is not a local folder"), "'nobody/m' is not an embedded model"),
    (ValueError("adapter was trained on another base\ndetails"), "'nobody/m' with adapters {'planner': '/x'}: "
                                                                 "adapter was trained on another base"),
])
def test_a_load_failure_is_one_line_naming_the_model(monkeypatch, raised, expected):
    def failing(*args, **kwargs):
        raise raised

    monkeypatch.setattr(backends, "local_backend", failing)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        backend_for("hf:nobody/m", {"planner": "/x"})
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_missing_model_folder_is_named_for_real(tmp_path):
    with pytest.raises(UserError, match="no-model"):
        backend_for(str(tmp_path / "no-model"))


# -- the call sites ---------------------------------------------------------------------------

def test_heart_run_serves_library_and_flag_adapters_through_backend_for(loads, tmp_path):
    from heart_distill import cli

    lib = _library(tmp_path, "verifier", "router")
    args = cli.build_parser().parse_args(["run", "--task", "t", "--model", "hf:smollm2-135m", "--engine",
                                          "llamacpp", "--library", str(lib), "--adapter", "router=mine"])
    backend = cli._backend(cli._loop_serving(args))
    assert (backend.engine, backend.model) == ("llamacpp", "smollm2-135m")
    assert backend.adapters == {"verifier": str(lib / "adapters" / "verifier"), "router": "mine"}


def test_heart_run_with_gold_serves_no_library_adapters(tmp_path, bfcl):
    from heart_distill.data.gold_teacher import GoldTeacher
    from heart_distill import cli

    args = cli.build_parser().parse_args(["run", "--task", "t", "--model", "gold", "--library",
                                          str(_library(tmp_path, "verifier"))])
    serving = cli._loop_serving(args)
    assert isinstance(cli._backend(serving, bfcl.load_task("multi_turn_base_0"), bfcl), GoldTeacher)


def test_one_heart_run_reads_the_library_and_parses_adapter_once(loads, tmp_path, monkeypatch, capsys):
    import heart.library
    from heart_distill import cli

    class Broken:  # every role call fails: the episode errors at once, without a model
        name = "broken"

        def generate(self, role, messages, sampling=None):
            raise ConnectionError("no model here")

    monkeypatch.setattr(backends, "local_backend", lambda *args, **kwargs: loads.append(args) or Broken())
    reads, parses = _counted(monkeypatch, heart.library, "load_library"), _counted(monkeypatch, cli, "_adapters")
    lib = _library(tmp_path, "verifier")
    code = cli.main(["run", "--task", "multi_turn_base_0", "--task", "multi_turn_base_1", "--model", "tiny-qwen3",
                     "--library", str(lib), "--adapter", "planner=p"])
    assert code == 1 and "every episode errored" in capsys.readouterr().err
    assert (reads["n"], parses["n"]) == (1, 1)
    (engine, model, adapters, _), = loads
    assert (engine, model, adapters) == ("peft", "tiny-qwen3", {"verifier": str(lib / "adapters" / "verifier"),
                                                                "planner": "p"})


def test_an_hf_teacher_is_built_by_backend_for_with_the_collections_batch_size(loads):
    from heart_distill.data.teachers import TeacherFactory

    teacher = TeacherFactory("hf:smollm2-135m", 0.0, environment=None, quantize="int8", max_batch_size=4)
    inner = teacher._shared.inner
    assert (inner.model, inner.max_batch_size, inner.options) == ("smollm2-135m", 4, {"quantize": "int8"})
    teacher._shared.close()


def test_a_gold_teacher_per_episode_is_built_by_backend_for(bfcl):
    from heart_distill.data.gold_teacher import GoldTeacher
    from heart_distill.data.teachers import TeacherFactory

    teacher = TeacherFactory("gold", 0.25, bfcl)
    assert isinstance(teacher(bfcl.load_task("multi_turn_base_0"), seed=1), GoldTeacher)
    assert teacher.name == "gold+faults0.25"


def test_eval_shared_backend_goes_through_backend_for(loads):
    from heart_distill.eval.models import resolve_role_models, shared_backend

    assert shared_backend(resolve_role_models("teacher:gold")) is None  # built per task
    shared_backend(resolve_role_models("base", "tiny-qwen3"), 2, "llamacpp")
    assert (loads[-1].engine, loads[-1].model, loads[-1].max_batch_size) == ("llamacpp", "tiny-qwen3", 2)
    shared_backend(resolve_role_models("teacher:hf:smollm2-135m"), 3, "llamacpp")  # the engine serves a teacher too
    assert (loads[-1].engine, loads[-1].model, loads[-1].adapters) == ("llamacpp", "smollm2-135m", {})
    with pytest.raises(UserError, match="built per task"):  # a base named gold is not a teacher in disguise
        shared_backend(resolve_role_models("base", "gold"))


def test_heart_serve_builds_its_backend_with_backend_for(loads, monkeypatch):
    import uvicorn

    from heart.serve import serve

    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)
    args = argparse.Namespace(host="127.0.0.1", port=8000, model="hf:tiny-qwen3", adapters={"planner": "p"},
                              engine="peft", quantize="int8", max_batch_size=4, max_prompt_tokens=100,
                              max_new_tokens=10, api_key=None)
    assert serve(args) == 0
    assert (loads[-1].model, loads[-1].adapters, loads[-1].max_batch_size, loads[-1].options) == (
        "tiny-qwen3", {"planner": "p"}, 4, {"quantize": "int8"})


def test_heart_serve_refuses_quantize_off_peft_in_one_line(capsys):
    from heart_distill.cli import main

    assert main(["serve", "--engine", "llamacpp", "--quantize", "int8"]) == 2
    assert capsys.readouterr().err.strip() == \
        "heart serve: error: --quantize int8 is a peft-engine option; --engine is llamacpp"


# -- helpers ----------------------------------------------------------------------------------

def _library(tmp_path, *roles: str):
    """A library folder whose admitted adapters are ``roles`` (a bare adapter_config.json each)."""
    from heart.library import new_library_dict

    lib = tmp_path / "library"
    data = new_library_dict()
    for role in roles:
        (lib / "adapters" / role).mkdir(parents=True)
        (lib / "adapters" / role / "adapter_config.json").write_text("{}")
        data["adapters"][role] = {"path": f"adapters/{role}", "version": 1, "evidence": {}}
    lib.mkdir(exist_ok=True)
    (lib / "library.json").write_text(json.dumps(data))
    return lib


def _counted(monkeypatch, module, name: str) -> dict:
    calls = {"n": 0}
    original = getattr(module, name)

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls
