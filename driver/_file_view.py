"""The session's view as the file helper resolves it (driver/file_helper.py): paths made
absolute, symlinks and `..` resolved by the kernel inside the sandbox, hidden paths refused;
and the contract's error for an OSError. Standard library only."""

import errno
import os


class FileError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def _inside(path, folder):
    return path == folder or folder == "/" or path.startswith(folder + "/")


def _kernel_path(path):
    """The real path of `path` as the kernel resolved it on opening it (one open and one
    readlink, where os.path.realpath makes a system call for each component), or None where
    the kernel cannot say (no such path, no /proc): os.path.realpath then says it."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        real = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    # A folder removed meanwhile, or one outside our root, is named in ways no path is.
    if not real.startswith("/") or real.endswith(" (deleted)"):
        return None
    return real


class FileView:
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
        # Folders resolved (and made) during the current burst of requests: a copy of many
        # files into one folder resolves it once. Forgotten whenever the helper waits
        # (`forget`), so what a command changes meanwhile is seen; within a burst this is
        # no staler than the resolution of any single request before its open.
        self._real_dirs = {}
        self.made_dirs = set()

    def forget(self):
        self._real_dirs.clear()
        self.made_dirs.clear()

    def _real_dir(self, folder):
        real = self._real_dirs.get(folder)
        if real is None:
            real = self._real_dirs[folder] = _kernel_path(folder) or os.path.realpath(folder)
        return real

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
        if name in ("", ".", "..") or full.endswith("/"):
            real = os.path.realpath(full)
        else:
            real = os.path.join(self._real_dir(parent or "/"), name)
            if follow and os.path.islink(real):
                real = os.path.realpath(real)
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
