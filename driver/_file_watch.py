"""file.watch inside the sandbox: inotify on the session's own view, events as the contract
names them (created, modified, removed, moved), a bounded queue per watch with a count of what
it dropped. Standard library only (ctypes for inotify).

One inotify instance per file helper, shared by its watches: the kernel allows a user few
instances. A folder watched by two watches has one kernel watch (the same wd); a wd is removed
when no watch uses it any more.
"""

import ctypes
import errno
import os
import struct

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x4000, 0x8000, 0x40000000
IN_DONT_FOLLOW, IN_EXCL_UNLINK = 0x2000000, 0x4000000
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
        | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
_EVENT = struct.Struct("iIII")
# Events one watch holds before they are sent; past it they are counted as dropped.
QUEUE_MAX = 4096
# Folders one watch watches at most; folders past it are not watched (counted as dropped).
MAX_FOLDERS = 8192

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return _libc


class Watch:
    def __init__(self, wid, root, shown, recursive):
        self.id = wid
        self.root = root  # real path of the watched folder
        self.shown = shown  # as the caller named it
        self.recursive = recursive
        self.queue = []  # [kind, path, to]
        self.dropped = 0
        self.folders = {}  # wd -> shown path of a folder this watch watches
        self.ended = False  # the watched folder itself went away

    def add(self, kind, path, to=None):
        if len(self.queue) >= QUEUE_MAX:
            self.dropped += 1
        elif kind == "modified" and self.queue and self.queue[-1] == [kind, path, None]:
            pass  # one write's IN_MODIFY, IN_CLOSE_WRITE, ...: one event
        else:
            self.queue.append([kind, path, to])

    def take(self):
        queue, self.queue = self.queue, []
        return queue


class Watcher:
    """The helper's inotify instance and its watches."""

    def __init__(self, view):
        self.view = view
        self.fd = None
        self.watches = {}  # watch id -> Watch
        self.users = {}  # wd -> {watch id: shown folder path}
        self.real = {}  # wd -> real folder path
        self.pending = None  # (cookie, wd, name, isdir) of an IN_MOVED_FROM without its pair

    def start(self, wid, shown, real, recursive):
        if self.fd is None:
            fd = _c().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
            self.fd = fd
        watch = Watch(wid, real, shown, recursive)
        self.watches[wid] = watch
        try:
            self._watch_folder(watch, real, shown, report=False)
        except BaseException:
            self.stop(wid)
            raise
        return watch

    def stop(self, wid):
        watch = self.watches.pop(wid, None)
        if watch is None:
            return None
        for wd in list(watch.folders):
            self._unuse(wd, wid)
        return watch

    def _unuse(self, wd, wid):
        users = self.users.get(wd)
        if users is None:
            return
        users.pop(wid, None)
        if not users:
            del self.users[wd]
            self.real.pop(wd, None)
            _c().inotify_rm_watch(self.fd, wd)

    def _watch_folder(self, watch, real, shown, report):
        """Watch `real` (and with `recursive` its folders, symlinks never followed, hidden
        ones left out). `report`: a folder that appeared: what is already in it is reported
        as created, since it came before its watch could see it."""
        todo = [(real, shown)]
        while todo:
            real_dir, shown_dir = todo.pop()
            if len(watch.folders) >= MAX_FOLDERS:
                watch.dropped += 1
                continue
            wd = _c().inotify_add_watch(self.fd, os.fsencode(real_dir), MASK)
            if wd < 0:
                code = ctypes.get_errno()
                if not watch.folders:
                    raise OSError(code, os.strerror(code))
                watch.dropped += 1  # gone meanwhile, or the system's limit of watches
                continue
            watch.folders[wd] = shown_dir
            self.users.setdefault(wd, {})[watch.id] = shown_dir
            self.real[wd] = real_dir
            if not watch.recursive:
                continue
            try:
                with os.scandir(real_dir) as it:
                    items = list(it)
            except OSError:
                continue
            for item in items:
                child = os.path.join(real_dir, item.name)
                if self.view.is_hidden(child):
                    continue
                if report:
                    watch.add("created", os.path.join(shown_dir, item.name))
                if watch.recursive and item.is_dir(follow_symlinks=False):
                    todo.append((child, os.path.join(shown_dir, item.name)))

    def read(self):
        """Turn what inotify has into events of the watches."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size:at + _EVENT.size + size].rstrip(b"\0")
                at += _EVENT.size + size
                self._event(wd, mask, cookie, os.fsdecode(name))
        self.flush_move()

    def flush_move(self):
        """An IN_MOVED_FROM whose IN_MOVED_TO did not follow: moved out of sight, a removal."""
        if self.pending is not None:
            _cookie, wd, name, _isdir = self.pending
            self.pending = None
            self._each(wd, name, "removed")

    def _each(self, wd, name, kind, to=None):
        for wid, folder in list(self.users.get(wd, {}).items()):
            watch = self.watches.get(wid)
            if watch is not None:
                watch.add(kind, os.path.join(folder, name) if name else folder, to)

    def _event(self, wd, mask, cookie, name):
        if mask & IN_Q_OVERFLOW:
            for watch in self.watches.values():
                watch.dropped += 1  # the kernel's queue overflowed: some number were lost
            return
        if mask & IN_IGNORED:
            for wid in list(self.users.pop(wd, {})):
                watch = self.watches.get(wid)
                if watch is not None:
                    watch.folders.pop(wd, None)
            self.real.pop(wd, None)
            return
        real_dir = self.real.get(wd)
        if real_dir is None:
            return
        if name and self.view.is_hidden(os.path.join(real_dir, name)):
            return
        if self.pending is not None and not (mask & IN_MOVED_TO and cookie == self.pending[0]):
            self.flush_move()
        isdir = bool(mask & IN_ISDIR)
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
            for wid, folder in list(self.users.get(wd, {}).items()):
                watch = self.watches.get(wid)
                if watch is not None and self.real.get(wd) == watch.root:
                    watch.add("removed", folder)
                    watch.ended = True
            return
        if mask & IN_MOVED_FROM:
            self.pending = (cookie, wd, name, isdir)
            return
        if mask & IN_MOVED_TO:
            if self.pending is not None and self.pending[0] == cookie:
                _c, from_wd, from_name, _d = self.pending
                self.pending = None
                self._moved(from_wd, from_name, wd, name)
            else:
                self._each(wd, name, "created")
            if isdir:
                self._new_folder(wd, name)
            return
        if mask & IN_CREATE:
            self._each(wd, name, "created")
            if isdir:
                self._new_folder(wd, name)
        elif mask & IN_DELETE:
            self._each(wd, name, "removed")
        elif mask & (IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB) and name:
            self._each(wd, name, "modified")

    def _moved(self, from_wd, from_name, to_wd, to_name):
        sources = self.users.get(from_wd, {})
        targets = self.users.get(to_wd, {})
        for wid in set(sources) | set(targets):
            watch = self.watches.get(wid)
            if watch is None:
                continue
            src = os.path.join(sources[wid], from_name) if wid in sources else None
            dst = os.path.join(targets[wid], to_name) if wid in targets else None
            if src and dst:
                watch.add("moved", src, dst)
                # The folders below a moved folder keep their wds: name them anew.
                for wd, folder in list(watch.folders.items()):
                    if folder == src or folder.startswith(src + "/"):
                        watch.folders[wd] = dst + folder[len(src):]
                        self.users[wd][wid] = watch.folders[wd]
            elif src:
                watch.add("removed", src)
            else:
                watch.add("created", dst)

    def _new_folder(self, wd, name):
        real_dir = self.real.get(wd)
        if real_dir is None:
            return
        for wid, folder in list(self.users.get(wd, {}).items()):
            watch = self.watches.get(wid)
            if watch is not None and watch.recursive:
                path = os.path.join(folder, name)
                if path not in watch.folders.values():
                    self._watch_folder(watch, os.path.join(real_dir, name), path, report=True)
