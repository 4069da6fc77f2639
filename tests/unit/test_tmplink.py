"""The task's short TMPDIR (services/agent/tmplink.py): a link to its own tmp/ directory, short enough for a Unix
socket's path, made once, found again, never taken from another user, removed only while it is still ours."""

import socket

import pytest

from services.agent import tmplink


def test_the_link_is_short_and_a_unix_socket_binds_through_it(tmp_path):
    target = tmp_path / ("x" * 60) / ("y" * 60) / "tmp"  # an attempt's directory, longer than a socket path holds
    target.mkdir(parents=True)
    link = tmplink.make(target, under=tmp_path)
    assert link is not None and link.parent == tmp_path and link.resolve() == target.resolve()
    with socket.socket(socket.AF_UNIX) as server, pytest.raises(OSError, match="too long"):
        server.bind(str(target / "listener"))  # what multiprocessing's resource sharer met under the old TMPDIR
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(link / "listener"))
    assert (target / "listener").is_socket()  # in the task's own directory
    assert len(str(tmplink.link_name(target))) == len("/tmp/tm-") + 16


def test_the_same_directory_gets_the_same_link_again(tmp_path):
    target = tmp_path / "attempt" / "tmp"
    target.mkdir(parents=True)
    first = tmplink.make(target, under=tmp_path)
    assert tmplink.make(target, under=tmp_path) == first == tmplink.link_name(target, under=tmp_path)


def test_a_name_someone_else_holds_is_not_taken(tmp_path):
    target = tmp_path / "attempt" / "tmp"
    target.mkdir(parents=True)
    squatter = tmplink.link_name(target, under=tmp_path)
    squatter.symlink_to(tmp_path / "elsewhere")  # a link to somewhere else under the expected name
    link = tmplink.make(target, under=tmp_path)
    assert link is not None and link != squatter and link.resolve() == target.resolve()
    tmplink.remove(squatter, target)  # not ours for this directory: left alone
    assert squatter.is_symlink()
    tmplink.remove(link, target)
    assert not link.exists() and not link.is_symlink() and target.is_dir()  # the directory itself stays


def test_no_link_where_none_can_be_made(tmp_path):
    assert tmplink.make(tmp_path / "tmp", under=tmp_path / "missing") is None


def test_an_earlier_runs_links_are_forgotten(tmp_path, monkeypatch):
    monkeypatch.setattr(tmplink, "LINK_DIR", tmp_path)
    attempts = [tmp_path / "jobs" / "j" / f"attempt-{n}-rank-0" for n in (1, 2)]
    for attempt in attempts:
        (attempt / "tmp").mkdir(parents=True)
    links = [tmplink.make(attempt / "tmp") for attempt in attempts]
    assert all(link is not None and link.is_symlink() for link in links)
    tmplink.forget_links(attempts[:1])
    assert not links[0].is_symlink() and links[1].is_symlink()
