"""An interrupted write never leaves a half-written file where a good one stood."""

import pytest

from spindle_dsl.atomic import write_atomic


def test_write_replaces_whole_file(tmp_path):
    target = tmp_path / "sub" / "plan.json"
    write_atomic(target, "old")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["plan.json"]


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.pt"
    write_atomic(target, "good")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("spindle_dsl.atomic.os.replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "bad")
    assert target.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_new_file_gets_umask_permissions_and_existing_keeps_its_mode(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "report.html"
        write_atomic(fresh, "x")
        assert fresh.stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "script.sh"
        kept.write_text("old")
        kept.chmod(0o755)
        write_atomic(kept, "new")
        assert kept.stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(umask)
