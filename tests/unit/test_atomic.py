"""heart.atomic: files and folders appear under their final name only once complete."""

import threading

import pytest

from heart import atomic


def test_a_published_file_replaces_the_old_one_and_leaves_no_temp(tmp_path):
    target = tmp_path / "stamp.json"
    target.write_text("old")
    atomic.publish_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["stamp.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path):
    target = tmp_path / "index.faiss"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic.publishing(target) as tmp:
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["index.faiss"]


def test_keep_name_writes_under_the_final_name_in_a_temp_folder(tmp_path):
    target = tmp_path / "lora-abc.gguf"
    with atomic.publishing(target, keep_name=True) as tmp:
        assert tmp.name == "lora-abc.gguf" and tmp.parent.parent == tmp_path
        tmp.write_bytes(b"gguf")
    assert target.read_bytes() == b"gguf"
    assert [p.name for p in tmp_path.iterdir()] == ["lora-abc.gguf"]


def test_threads_publishing_one_target_each_leave_a_complete_file(tmp_path):
    target = tmp_path / "vector.npy"
    barrier = threading.Barrier(8, timeout=5)

    def write(i):
        barrier.wait()
        atomic.publish_bytes(target, bytes([i]) * 4096)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = target.read_bytes()
    assert len(data) == 4096 and len(set(data)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["vector.npy"]


def test_publish_files_lands_the_marker_last(tmp_path, monkeypatch):
    staged, out = tmp_path / "staged", tmp_path / "out"
    staged.mkdir()
    out.mkdir()
    (out / "manifest.json").write_text("old manifest")
    for name in ("weights", "manifest.json"):
        (staged / name).write_text(f"new {name}")
    order = []
    real_replace = atomic.os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: order.append(b.name) or real_replace(a, b))
    atomic.publish_files(staged, out, ["weights"], marker="manifest.json")
    assert order == ["weights", "manifest.json"]
    assert (out / "manifest.json").read_text() == "new manifest.json"


def test_a_staged_folder_is_swapped_in_whole_or_not_at_all(tmp_path):
    final = tmp_path / "datasets"
    final.mkdir()
    (final / "old").write_text("previous build")
    with pytest.raises(MemoryError):
        with atomic.locked(final), atomic.staged_dir(final) as staging:
            (staging / "new").write_text("half")
            raise MemoryError
    assert sorted(p.name for p in final.iterdir()) == ["old"]
    with atomic.locked(final), atomic.staged_dir(final) as staging:
        (staging / "new").write_text("complete")
    assert sorted(p.name for p in final.iterdir()) == ["new"]
    assert not [p for p in tmp_path.iterdir() if atomic.STAGING_TAG in p.name or atomic.OLD_TAG in p.name]


def test_recover_restores_a_folder_a_kill_left_under_its_old_name(tmp_path):
    final = tmp_path / "m"
    old = tmp_path / f".m{atomic.OLD_TAG}123-abcd"  # killed between the fallback's two renames
    old.mkdir()
    (old / "config.json").write_text("{}")
    (tmp_path / f".m{atomic.STAGING_TAG}123-abcd").mkdir()
    atomic.recover(final)
    assert (final / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
