"""Large received frames reuse freed buffers (nbdist.hub.memory): set only when frames are large."""

from nbdist.hub import memory


def test_small_frames_leave_malloc_alone_and_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setattr(memory, "_done", 0)
    assert memory.reuse_large_buffers(memory.LARGE_FRAME_BYTES - 1) is False
    monkeypatch.setenv("NBDIST_MALLOPT", "0")
    assert memory.reuse_large_buffers(40 << 20) is False
    monkeypatch.delenv("NBDIST_MALLOPT")
    assert memory.reuse_large_buffers(40 << 20) is True  # nothing was set before: it sets it now


def test_a_large_frame_sets_it_once(monkeypatch):
    monkeypatch.setattr(memory, "_done", 0)
    monkeypatch.delenv("NBDIST_MALLOPT", raising=False)
    assert memory.reuse_large_buffers(40 << 20) is True  # glibc (Linux CI and this machine)
    assert memory.reuse_large_buffers(20 << 20) is False  # already covers smaller frames
