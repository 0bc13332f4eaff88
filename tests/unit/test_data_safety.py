"""Data safety: collections never share a shard, appends never bury a torn line, concurrent
writers never lose an update, and a re-build never leaves a half-old, half-new dataset.

Each test here reproduces a way data could be lost or mixed, and fails if the guard against it goes.
"""

from __future__ import annotations

import hashlib
import json
import threading

import pytest

from heart_distill.data.collect import MANIFEST, _write_manifest, add_arguments, collect
from heart.traces import TRACE_FORMAT_VERSION, TraceReadStats, TraceWriter, read_trace
from test_dataset_build import write_run
from test_traces import event


def collect_args(out, *extra: str):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--env", "bfcl", "--teacher", "gold", "--limit", "1", "--concurrency", "1",
                              "--out", str(out), *extra])


def shards(out):
    return sorted((out / "traces").glob("*.jsonl"))


# -- collection shards ---------------------------------------------------------------------

def test_a_collection_never_appends_into_another_runs_shard(tmp_path):
    out = tmp_path / "run"
    assert collect(collect_args(out, "--split", "train")) == 0
    assert collect(collect_args(out, "--split", "dev")) == 0
    first, second = shards(out)
    before = second.read_bytes()
    first.unlink()  # an operator deletes an earlier shard: a count-based name now collides
    assert collect(collect_args(out, "--split", "test")) == 0
    assert second.read_bytes() == before, "a new run appended into another run's shard"
    assert len(shards(out)) == 2
    for shard in shards(out):  # every shard holds whole episodes of one run
        stats = TraceReadStats()
        rows = list(read_trace(shard, stats))
        assert stats.torn_lines == 0 and len({r["task_id"] for r in rows}) == 1


def test_resume_of_a_finished_collection_is_a_clean_no_op(tmp_path, capsys):
    out = tmp_path / "run"
    assert collect(collect_args(out)) == 0
    before = [p.read_bytes() for p in shards(out)]
    assert collect(collect_args(out, "--resume")) == 0
    assert [p.read_bytes() for p in shards(out)] == before  # no new (empty) shard either
    assert "nothing to run" in capsys.readouterr().err


def test_resume_on_a_corrupted_trace_is_a_clear_error(tmp_path):
    out = tmp_path / "run"
    assert collect(collect_args(out)) == 0
    (shard,) = shards(out)
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(SystemExit) as raised:
        collect(collect_args(out, "--resume"))
    message = str(raised.value)
    assert "error" in message and shard.name in message and ":2:" in message


# -- trace writer --------------------------------------------------------------------------

def test_appending_after_a_kill_does_not_bury_the_torn_line(tmp_path):
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path, fsync=False) as writer:
        writer.write(event(0))
    with open(path, "a") as f:  # the previous `heart run --trace` was killed mid-line
        f.write(json.dumps({"kind": "event", "version": TRACE_FORMAT_VERSION})[:20])
    with TraceWriter(path, fsync=False) as writer:  # the next run appends
        assert writer.dropped_torn_bytes == 20
        writer.write(event(1))
    stats = TraceReadStats()
    rows = list(read_trace(path, stats))  # an unguarded append makes this "malformed trace line"
    assert [r["step"] for r in rows] == [0, 1] and stats.torn_lines == 0


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "trace.jsonl"
    from dataclasses import asdict

    path.write_text(json.dumps(asdict(event(0))))  # hand-edited: no final newline
    with TraceWriter(path, fsync=False) as writer:
        assert writer.dropped_torn_bytes == 0
        writer.write(event(1))
    assert [r["step"] for r in read_trace(path)] == [0, 1]


def test_one_writer_shared_by_threads_writes_whole_lines(tmp_path):
    path = tmp_path / "trace.jsonl"
    big = "x" * 200_000  # larger than any I/O buffer: one write is several syscalls

    with TraceWriter(path, fsync=False) as writer:
        def work(worker: int) -> None:
            for i in range(10):
                writer.write({"kind": "event", "version": TRACE_FORMAT_VERSION, "worker": worker,
                              "i": i, "pad": big})

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    rows = list(read_trace(path))
    assert sorted((r["worker"], r["i"]) for r in rows) == [(w, i) for w in range(8) for i in range(10)]


def test_trace_writer_records_values_json_cannot_encode(tmp_path):
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path, fsync=False) as writer:
        writer.write({"kind": "event", "version": TRACE_FORMAT_VERSION, "value": {1, 2}, "obj": object()})
    (row,) = read_trace(path)
    assert isinstance(row["value"], str) and "object" in row["obj"]


def test_a_trace_line_that_is_not_an_object_is_a_clear_error(tmp_path):
    from heart.traces import TraceFormatError

    path = tmp_path / "trace.jsonl"
    path.write_text('[1, 2]\n"x"\n')
    with pytest.raises(TraceFormatError, match=r":1: .*not a JSON object"):
        list(read_trace(path))


# -- manifest ------------------------------------------------------------------------------

def test_concurrent_manifest_updates_lose_nothing(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    # Widen the read-modify-write window the way a slow disk does, so that the race shows.
    import heart_distill.data.collect as collect_module

    real_dumps = collect_module.json.dumps

    def slow_dumps(*a, **kw):
        threading.Event().wait(0.01)
        return real_dumps(*a, **kw)

    monkeypatch.setattr(collect_module.json, "dumps", slow_dumps)

    class Teacher:
        name = "gold"

    def one(i: int) -> None:
        args = collect_args(out, "--split", "train")
        args.split = f"split{i}"
        _write_manifest(out, args, Teacher(), ["t"])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    manifest = json.loads((out / MANIFEST).read_text())
    assert sorted(c["split"] for c in manifest["collections"]) == sorted(f"split{i}" for i in range(12))
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")], "temp files left behind"


def test_a_collection_records_its_loop_policy_and_resume_refuses_another(tmp_path, capsys):
    from heart.middleware import DEFAULT_PATH

    out, middleware = tmp_path / "run", tmp_path / "middleware.yaml"
    middleware.write_text(DEFAULT_PATH.read_text())
    assert collect(collect_args(out, "--middleware", str(middleware), "--no-messages")) == 0
    (entry,) = json.loads((out / MANIFEST).read_text())["collections"]
    assert entry["policy"] == {"replan_budget": 3, "verify": "step", "middleware": str(middleware),
                               "middleware_sha256": hashlib.sha256(middleware.read_bytes()).hexdigest(),
                               "relevance": False, "messages": False, "validation": "default",
                               "validation_sha256": None, "router_mode": "plan"}
    shards_before = shards(out)

    for other, named in ((["--middleware", str(middleware)], "messages: False there, True now"),
                         (["--middleware", str(middleware), "--no-messages", "--relevance"],
                          "relevance: False there, True now"),
                         (["--middleware", str(middleware), "--no-messages", "--router-mode", "step"],
                          "router_mode: plan there, step now")):
        with pytest.raises(SystemExit) as refused:
            collect(collect_args(out, *other, "--resume"))
        assert refused.value.code == 2 and named in capsys.readouterr().err
    middleware.write_text(DEFAULT_PATH.read_text() + "# edited\n")  # same path, other content
    with pytest.raises(SystemExit) as refused:
        collect(collect_args(out, "--middleware", str(middleware), "--no-messages", "--resume"))
    assert refused.value.code == 2 and "middleware_sha256" in capsys.readouterr().err
    assert shards(out) == shards_before  # nothing ran into the folder

    # the datasets built from the run name the policy their traces were made under
    _build(out, out / "datasets", roles=("planner",))
    card = (out / "datasets" / "planner" / "README.md").read_text()
    assert "loop policy of bfcl/train with `gold`" in card and '"messages": false' in card


def test_resume_of_a_collection_whose_manifest_predates_the_policy_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert collect(collect_args(out)) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    entry = manifest["collections"][0]
    del entry["policy"]
    entry.update(replan_budget=3, verify="step", middleware="default")  # what such manifests held
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SystemExit) as refused:
        collect(collect_args(out, "--resume"))
    assert refused.value.code == 2 and "before manifests recorded the loop policy" in capsys.readouterr().err


# -- dataset build -------------------------------------------------------------------------

def _build(run, out, **options):
    from heart_distill.data.build import BuildOptions, build_role_datasets

    return build_role_datasets(run, out, BuildOptions(verifier_balance=None, token_counter="whitespace",
                                                      **options))


def _snapshot(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_crash_during_overwrite_leaves_the_previous_build_whole(tmp_path, monkeypatch):
    run = tmp_path / "run"
    write_run(run)
    out = run / "datasets"
    _build(run, out)
    before = _snapshot(out)

    import heart_distill.data.card as card_module  # build.py imports write_card from it at call time

    calls = {"n": 0}
    original = card_module.write_card

    def crash_on_second_role(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemoryError("killed while saving the second role")
        return original(*a, **kw)

    monkeypatch.setattr(card_module, "write_card", crash_on_second_role)
    with pytest.raises(MemoryError):
        _build(run, out, overwrite=True, seed=1)
    assert _snapshot(out) == before, "a crashed overwrite left a mix of old and new roles"
    assert not [p for p in run.iterdir() if ".staging-" in p.name or ".old-" in p.name], "staging left behind"


def test_a_role_subset_rebuild_keeps_the_other_roles_in_the_report(tmp_path):
    run = tmp_path / "run"
    write_run(run)
    out = run / "datasets"
    first = _build(run, out)
    _build(run, out, overwrite=True, roles=("router",))
    report = json.loads((out / "build_report.json").read_text())
    assert sorted(report["roles"]) == sorted(first.roles)
    for role in ("planner", "primitive", "verifier"):
        assert (out / role / "dataset_dict.json").exists()


def test_an_errored_episode_is_dropped_and_its_rerun_is_used(tmp_path):
    from test_dataset_build import TRAIN, Episode

    from heart.traces import EpisodeRecord

    run = tmp_path / "run"
    with TraceWriter(run / "traces" / "shard-a.jsonl", fsync=False) as w:
        x = Episode(w, "X", TRAIN[0])
        x.attempt(0, "PASS")
        w.write(EpisodeRecord(episode_id="X", task_id=TRAIN[0], env="toy", score=0.0, success=False,
                              verdicts=["PASS"], replans_used=[0], errored=True, error="checker: crashed"))
    with TraceWriter(run / "traces" / "shard-b.jsonl", fsync=False) as w:  # --resume ran it again
        x = Episode(w, "X", TRAIN[0])
        x.attempt(0, "PASS")
        x.close(True)
    report = _build(run, run / "datasets")
    assert report.episodes["errored"] == 1 and report.episodes["records"] == 1
    assert report.episodes.get("duplicate_records", 0) == 0
    assert report.roles["planner"]["removed"]["errored_episode"] == 1
    assert report.roles["planner"]["removed"]["event_after_episode_record"] == 0
    assert sum(report.roles["planner"]["splits"].values()) == 1
