"""The file helper's operations (driver/file_helper.py): paths resolved as the session sees
them, hidden paths refused, errors as the contract's codes. Standard library only; runs inside
the sandbox, with the session's uid, umask and mounts, so the operating system enforces every
rule of the session's view (a read-only mount refuses, a path outside the view is absent) and
this module adds the one the mounts cannot say: a hidden path is absent, not an empty folder.
"""

import errno
import os
import stat

# The most one read returns (the contract's 8 MiB per file.read).
MAX_READ = 8 << 20
# Bytes of a file moved through the helper per system call.
CHUNK = 1 << 20
# Room a listing's entries may take in their reply: past it the listing is truncated.
LIST_BUDGET = 6 << 20
TEMP_PREFIX = ".toolsd-"
_KINDS = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink"}


class FileError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def _inside(path, folder):
    return path == folder or folder == "/" or path.startswith(folder + "/")


class View:
    """The session's view: its workspace and what is hidden in it (from the daemon's plan of
    the sandbox's mounts), its file size limit and umask."""

    def __init__(self, config):
        self.workspace = config["workspace"]
        self.hidden = tuple(config.get("hidden") or ())
        # Hidden folders that contain the workspace: hidden except for the workspace itself.
        self.outer = tuple(config.get("outer_hidden") or ())
        self.file_limit = int(config["file_limit"])
        mask = os.umask(0)
        os.umask(mask)
        self.umask = mask

    def is_hidden(self, real):
        if any(_inside(real, h) for h in self.hidden):
            return True
        return any(_inside(real, h) and not _inside(real, self.workspace) for h in self.outer)

    def shown(self, path):
        """The path as the caller gave it, made absolute and normalised: what replies name."""
        if not path.startswith("/"):
            path = os.path.join(self.workspace, path)
        norm = os.path.normpath(path)
        return "/" + norm.lstrip("/")

    def resolve(self, path, follow=True):
        """(shown path, real path). `follow`: symlinks resolved to the end; else the last
        component is kept as a name (stat, remove, rename act on a link itself). `..` is
        resolved as the kernel does, inside the sandbox: it cannot climb above its /."""
        shown = self.shown(path)
        full = path if path.startswith("/") else os.path.join(self.workspace, path)
        parent, name = os.path.split(full.rstrip("/") or "/")
        if follow or name in ("", ".", "..") or full.endswith("/"):
            real = os.path.realpath(full)
        else:
            real = os.path.join(os.path.realpath(parent or "/"), name)
        if self.is_hidden(real):
            raise FileError("not_found", "%s: No such file or directory (as the session's own "
                            "commands see it); check the path" % shown)
        return shown, real


def fail(e, shown, doing):
    """The FileError for OSError `e`, met while `doing` `shown`."""
    code = e.errno
    if code in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
        return FileError("not_found", "%s: %s (as the session's own commands see it); check "
                         "the path" % (shown, os.strerror(code)))
    if code == errno.EROFS:
        return FileError("io_error", "cannot %s %s: read-only file system (the session was "
                         "opened with writable: false, or the path is on a read-only mount)"
                         % (doing, shown))
    if code == errno.EFBIG:
        return FileError("limit_exceeded", "cannot %s %s: over the session's file size limit"
                         % (doing, shown))
    if code in (errno.EACCES, errno.EPERM):
        why = "permission denied"
    elif code in (errno.ENOSPC, errno.EDQUOT):
        why = "no space left on device"
    elif code == errno.EISDIR:
        why = "it is a directory"
    elif code == errno.ENOTEMPTY:
        why = "the folder is not empty (pass recursive: true to remove it with its contents)"
    elif code == errno.EEXIST:
        why = "it already exists"
    elif code == errno.ENAMETOOLONG:
        return FileError("bad_params", "%s: file name too long" % shown)
    elif code == errno.EXDEV:
        why = "source and destination are on different mounts"
    elif code == errno.EBUSY:
        why = "it is a mount point of the sandbox"
    else:
        why = os.strerror(code) if code else str(e)
    return FileError("io_error", "cannot %s %s: %s" % (doing, shown, why))


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
    """(result, data): at most MAX_READ bytes from `offset`."""
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
        os.close(fd)
    return ({"size": size, "eof": offset + got >= size, "mode": stat.S_IMODE(st.st_mode),
             "mtime": st.st_mtime}, data)


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
        if req.get("parents", True):
            _makedirs(view, folder, shown)
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
    temp = os.path.join(folder, "%s%s.%s" % (TEMP_PREFIX, name[:200], os.urandom(6).hex()))
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
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
            if view.is_hidden(child):
                continue
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
