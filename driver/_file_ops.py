"""The file helper's operations (driver/file_helper.py): paths resolved as the session sees
them, hidden paths refused, errors as the contract's codes. Standard library only; runs inside
the sandbox, with the session's uid, umask and mounts, so the operating system enforces every
rule of the session's view (a read-only mount refuses, a path outside the view is absent) and
this module adds the one the mounts cannot say: a hidden path is absent, not an empty folder.
"""

import itertools
import os
import stat

from _file_view import FileError, FileView, fail  # noqa: F401 (the helper's names for them)

# The most one read returns (the contract's 8 MiB per file.read).
MAX_READ = 8 << 20
# Bytes of a file moved through the helper per system call.
CHUNK = 1 << 20
# A read part up to this size comes inline in the reply; a larger one is read by the daemon
# from the file descriptor we pass it (see read).
INLINE_MAX = 256 << 10
# Room a listing's entries may take in their reply: past it the listing is truncated.
LIST_BUDGET = 6 << 20
TEMP_PREFIX = ".toolsd-"
_TEMPS = itertools.count(os.getpid() << 20)
_KINDS = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink"}


def _is_text(name):
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def entry(shown, st, real=None):
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "other")
    target = None
    if kind == "symlink" and real is not None:
        try:
            target = os.readlink(real)
        except OSError:
            target = None
    return {"path": shown, "type": kind, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
            "mtime": st.st_mtime, "target": target}


def _regular(fd, shown):
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise FileError("io_error", "cannot use %s: it is a directory" % shown)
    if not stat.S_ISREG(st.st_mode):
        raise FileError("io_error", "cannot use %s: not a regular file (a device, FIFO or "
                        "socket)" % shown)
    return st


def read(view, req):
    """(result, data, fd): at most MAX_READ bytes from `offset`. A part larger than
    INLINE_MAX is not read here: the file, opened here with the session's view and rights,
    goes to the daemon (`fd`, for the caller to pass and close), which reads the part itself
    in one go instead of through our socket in many small handoffs."""
    shown, real = view.resolve(req["path"])
    offset = req.get("offset") or 0
    length = req.get("length")
    want = MAX_READ if length is None else min(length, MAX_READ)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise fail(e, shown, "read")
    try:
        st = _regular(fd, shown)
        want = max(0, min(want, st.st_size - offset))
        result = {"size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "mtime": st.st_mtime}
        if want > INLINE_MAX:
            result["eof"] = False  # the daemon says, once it has read
            result["fd"] = True
            passed, fd = fd, None
            return result, b"", passed
        data = bytearray(want)
        got = 0
        view_ = memoryview(data)
        while got < want:
            n = os.preadv(fd, [view_[got:got + CHUNK]], offset + got)
            if n == 0:
                break  # the file shrank meanwhile
            got += n
        del view_
        del data[got:]
        size = os.fstat(fd).st_size
    except OSError as e:
        raise fail(e, shown, "read")
    finally:
        if fd is not None:
            os.close(fd)
    result.update(size=size, eof=offset + got >= size)
    return result, data, None


def _check_limit(view, shown, end):
    if end > view.file_limit:
        raise FileError("limit_exceeded", "%s would be %d bytes, over the session's file size "
                        "limit of %d bytes (limits.file_mb); write less, or open the session "
                        "with a larger limits.file_mb" % (shown, end, view.file_limit))


def write(view, req, chunks):
    """Write the request's data (`chunks`: an iterator of its bytes as they arrive)."""
    shown, real = view.resolve(req["path"])
    size = req["size"]
    offset = req.get("offset")
    append = bool(req.get("append"))
    mode = req.get("mode")
    folder = os.path.dirname(real)
    try:
        if req.get("parents", True) and folder not in view.made_dirs:
            _makedirs(view, folder, shown)
            view.made_dirs.add(folder)
        if offset is None and not append:
            return _replace(view, real, shown, size, mode, chunks)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
        fd = os.open(real, flags | (os.O_APPEND if append else 0),
                     0o666 if mode is None else mode)
    except OSError as e:
        raise fail(e, shown, "write")
    try:
        st = _regular(fd, shown)
        start = st.st_size if append else offset
        _check_limit(view, shown, start + size)
        at = start
        for chunk in chunks:
            if append:
                _write_all(fd, chunk)
            else:
                _pwrite_all(fd, chunk, at)
            at += len(chunk)
        if mode is not None:
            os.fchmod(fd, mode)
        return {"size": os.fstat(fd).st_size}
    except OSError as e:
        raise fail(e, shown, "write")
    finally:
        os.close(fd)


def _replace(view, real, shown, size, mode, chunks):
    """A whole write: a temporary file in the same folder, renamed over `real` once complete,
    so a reader sees the old file or the new one, never a part (a writer killed midway leaves
    the old file and a temporary `.toolsd-*` file). The old file's mode is kept."""
    _check_limit(view, shown, size)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise FileError("io_error", "cannot write %s: it is a directory" % shown)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise FileError("io_error", "cannot write %s: not a regular file (a device, FIFO or "
                        "socket)" % shown)
    if mode is None:
        mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~view.umask
    folder, name = os.path.split(real)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    temp = os.path.join(folder, "%s%s.%d" % (TEMP_PREFIX, name[:200], next(_TEMPS)))
    try:
        fd = os.open(temp, flags, 0o600)
    except FileExistsError:  # left by an earlier helper (pids repeat in a sandbox)
        temp = os.path.join(folder, "%s%s.%s" % (TEMP_PREFIX, name[:200], os.urandom(8).hex()))
        fd = os.open(temp, flags, 0o600)
    try:
        try:
            for chunk in chunks:
                _write_all(fd, chunk)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.rename(temp, real)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    return {"size": size}


def _write_all(fd, data):
    view_ = memoryview(data)
    while view_:
        view_ = view_[os.write(fd, view_):]


def _pwrite_all(fd, data, at):
    view_ = memoryview(data)
    while view_:
        n = os.pwrite(fd, view_, at)
        view_, at = view_[n:], at + n


def _makedirs(view, real, shown):
    """Make `real` and its missing parents (0777 less the umask, as mkdir -p)."""
    missing = []
    path = real
    while not os.path.isdir(path):
        if os.path.lexists(path):
            raise FileError("io_error", "cannot make the folders of %s: %s exists and is not "
                            "a folder" % (shown, path))
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        if view.is_hidden(path):
            raise FileError("not_found", "%s: No such file or directory" % shown)
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise


def stat_(view, req):
    shown, real = view.resolve(req["path"], follow=False)
    try:
        return entry(shown, os.lstat(real), real)
    except OSError as e:
        raise fail(e, shown, "stat")


def listing(view, req):
    """Entries below a folder, `depth` levels deep, parents before their entries, each
    folder's entries by name; symlinks listed, never followed; hidden entries left out."""
    shown, real = view.resolve(req["path"])
    depth = req.get("depth", 1)
    limit = req.get("limit", 10000)
    try:
        if not stat.S_ISDIR(os.stat(real).st_mode):
            raise FileError("io_error", "cannot list %s: not a folder (file.stat describes a "
                            "file)" % shown)
    except OSError as e:
        raise fail(e, shown, "list")
    entries = []
    budget = LIST_BUDGET
    todo = [(shown, real, 1)]
    while todo:
        shown_dir, real_dir, level = todo.pop()
        try:
            with os.scandir(real_dir) as it:
                found = sorted(it, key=lambda e: e.name)
        except OSError as e:
            if real_dir == real:
                raise fail(e, shown, "list")
            continue  # unreadable below the top: listed, not entered
        below = []
        for item in found:
            child = os.path.join(real_dir, item.name)
            if view.is_hidden(child) or not _is_text(item.name):
                continue  # hidden; or a name the wire cannot carry (not UTF-8)
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            one = entry(os.path.join(shown_dir, item.name), st, child)
            budget -= 64 + len(one["path"]) + len(one["target"] or "")
            if len(entries) >= limit or budget < 0:
                return {"entries": entries, "truncated": True}
            entries.append(one)
            if level < depth and one["type"] == "dir":
                below.append((one["path"], child, level + 1))
        todo.extend(reversed(below))
    return {"entries": entries, "truncated": False}


def mkdir(view, req):
    shown, real = view.resolve(req["path"])
    try:
        if req.get("parents", True):
            _makedirs(view, real, shown)
        else:
            os.mkdir(real)
    except OSError as e:
        raise fail(e, shown, "make folder")
    return {}


def remove(view, req):
    shown, real = view.resolve(req["path"], follow=False)
    counted = [0]
    try:
        st = os.lstat(real)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(real)
            return {"removed": 1}
        if req.get("recursive"):
            _remove_tree(view, real, counted)
        os.rmdir(real)
    except OSError as e:
        error = fail(e, shown, "remove")
        if counted[0]:
            error.message += " (%d entries below it were removed)" % counted[0]
        raise error
    return {"removed": counted[0] + 1}


def _remove_tree(view, real, counted):
    """Everything below folder `real`, depth first, symlinks removed and never followed."""
    with os.scandir(real) as it:
        items = list(it)
    for item in items:
        child = os.path.join(real, item.name)
        if view.is_hidden(child):
            continue  # stays; the folder holding it will not go either
        if item.is_dir(follow_symlinks=False):
            _remove_tree(view, child, counted)
            os.rmdir(child)
        else:
            os.unlink(child)
        counted[0] += 1


def rename(view, req):
    shown, real = view.resolve(req["path"], follow=False)
    shown_to, real_to = view.resolve(req["to"], follow=False)
    try:
        os.lstat(real)
        if not req.get("overwrite") and os.path.lexists(real_to):
            raise FileError("io_error", "cannot rename %s to %s: %s already exists (pass "
                            "overwrite: true to replace it)" % (shown, shown_to, shown_to))
        os.rename(real, real_to)
    except OSError as e:
        raise fail(e, shown, "rename")
    return {}
