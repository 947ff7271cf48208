/*
 * pv-monitor: the embedded runtime's zygote and per-container monitors, in C (conmon /
 * containerd-shim style). The same contract as zygote.py + monitor.py, which stay the fallback
 * where no C compiler was available:
 *
 *   pv-monitor --zygote FD
 *
 * The zygote keeps SPARES spare monitors forked and hands each spare's end of its socket to the
 * runtime over FD (zygote.py's protocol: "spare PID TICKS" + the fd). The runtime sends a spare its container: an 8-byte
 * big-endian length and the fds (reply pipe, log file or none), then NUL-separated fields
 * STATE NOTIFY CWD LOG_PATH ARGC ARGV... ENVC ENV... [MOUNTC (SRC DST RO PROPAGATION)...] then
 * keyed sections: "security" UID GID NGROUPS GROUP... CAPS NNP RO_ROOT MANAGE NMASKED PATH...
 * NREADONLY PATH... (parse_security; applied by apply_security_mounts and apply_security) and
 * "CGROUPS" N FILE... (parse_cgroups; joined by join_cgroups), "OOM" VALUE (written by
 * write_oom_score_adj before the mounts and the ids change), "NETNS" PATH (the sandbox's
 * network namespace, joined by join_netns right after) and "ROOTFS" MERGED UPPER WORK
 * NLOWER LOWER... NETC (NAME SRC)... (parse_rootfs: an image's overlay root, set up by
 * rootfs_prepare before the volume mounts, entered by rootfs_pivot after them, before the
 * security step) and "SECCOMP" (parse_seccomp: a seccomp filter, built with libseccomp when
 * compiled with PV_SECCOMP, loaded right before exec). The spare becomes the
 * container's monitor:
 *
 * it leaves the zygote's session, starts ARGV in its own session/process group (PATH searched in
 * the container's environment, stdout/stderr to pipes, stdin /dev/null, default signal
 * dispositions and an empty mask; in the container's cgroups, joined before the exec, see
 * join_cgroups; with mounts, in a private mount namespace holding them, see apply_mounts), writes STATE.started.json, answers once on the reply pipe
 * ({"ok": true, "monitor_pid", "monitor_ticks", "pid", "pid_ticks", "started_at"} or
 * {"ok": false, "error": "..."}), copies the output into the log fd as CRI log records
 * ("<RFC3339Nano> <stdout|stderr> <F|P> <line>", lines over 16 KiB split into P records),
 * reopens LOG_PATH on SIGHUP, and when the process exits: SIGKILLs the rest of its process group,
 * drains the output for at most 2 s, writes STATE.exit.json
 * ({"exit_code", "finished_at", "reason", "message"}), then sends the same record plus "id" (the
 * last component of STATE) as one datagram to the runtime's unix socket NOTIFY (best effort;
 * "" = none) and exits. exit.json is written atomically (tmp + rename); started.json, a new
 * file, with one write. STATE is <runtime root>/containers/<container id> (store.py). The
 * monitor's own stderr is the zygote's (the runtime's, so the agent's log): it writes nothing
 * there itself, but a crash message from libc would land there.
 *
 * Why C: a monitor lives as long as its container. A Python monitor forked from a zygote keeps
 * ~1.8 MB of private pages (110 pods: ~200 MB); this one ~0.1 MB. And a start costs a fork of
 * this small process ahead of time, not a fork of a Python process plus an exec.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef PV_SECCOMP
#include <seccomp.h> /* Debian libseccomp-dev; native.py builds with it when present */
#endif

#define MAX_LINE (16 * 1024)
#define DRAIN_AFTER_EXIT_MS 2000
#define LOG_FLAGS (O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC)
#define SPARES 2         /* monitors kept forked (zygote.py's _SPARES) */
#define REFILL_IDLE_MS 3 /* quiet before forking a spare (zygote.py's _REFILL_IDLE) */
#define MAX_REQUEST (64u << 20)

extern char **environ;

static const char *state_prefix;
static const char *log_path;
static int log_fd = -1;
/* PODVISOR_MONITOR_HOLD (fault-injection tests only): a FIFO the monitor opens and reads to
 * EOF after its container started and before it records started.json, so a test can kill or
 * restart the runtime while a start is exactly there. Read in main(): a monitor's environ is
 * its container's. */
static const char *hold_fifo;

static long long now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Field 22 of /proc/PID/stat (start time in clock ticks since boot); 0 when unknown. */
static unsigned long long start_ticks(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p += 2; /* field 3 */
    for (int field = 3; field < 22 && *p; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

static void write_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* a full disk must not kill the container */
        }
        data += n;
        len -= (size_t)n;
    }
}

/* JSON string body: escapes quotes, backslashes and control characters. */
static size_t json_escape(char *out, size_t cap, const char *s) {
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return o;
}

/* 0 when the new file NAME holds all of DATA; else -1 with errno set (and no file). */
static int write_file_new(const char *name, const char *data) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", state_prefix, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t len = strlen(data);
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int saved = n < 0 ? errno : EIO;
            close(fd);
            unlink(path);
            errno = saved;
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return close(fd);
}

/* One datagram to the runtime's exit socket; best effort (the pidfd watch and exit.json are
 * the runtime's other ways to learn of the exit). */
static void send_note(const char *path, const char *note) {
    struct sockaddr_un addr;
    if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof addr.sun_path)
        return;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, path);
    sendto(fd, note, strlen(note), 0, (struct sockaddr *)&addr, sizeof addr);
    close(fd);
}

static void write_file_atomic(const char *name, const char *data) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s.%s", state_prefix, name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    write_all(fd, data, strlen(data));
    close(fd);
    rename(tmp, path);
}

/* --- CRI log records ------------------------------------------------------------------------ */

struct stream {
    int fd;
    const char *name;
    char partial[MAX_LINE];
    size_t used;
};

static size_t stamp(char *out, size_t cap) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    return n + (size_t)snprintf(out + n, cap - n, ".%09ldZ", ts.tv_nsec);
}

static void record(const char *ts, const char *stream, char tag, const char *line, size_t len) {
    char head[128];
    int n = snprintf(head, sizeof head, "%s %s %c ", ts, stream, tag);
    if (log_fd < 0)
        return;
    write_all(log_fd, head, (size_t)n);
    write_all(log_fd, line, len);
    write_all(log_fd, "\n", 1);
}

/* Append data to the stream; emit complete lines (F) and full 16 KiB chunks (P). */
static void feed(struct stream *s, const char *data, size_t len, int final) {
    char ts[64];
    stamp(ts, sizeof ts);
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\n') {
            record(ts, s->name, 'F', s->partial, s->used);
            s->used = 0;
            continue;
        }
        if (s->used == MAX_LINE) {
            record(ts, s->name, 'P', s->partial, s->used);
            s->used = 0;
        }
        s->partial[s->used++] = data[i];
    }
    if (final && s->used > 0) {
        record(ts, s->name, 'F', s->partial, s->used);
        s->used = 0;
    }
}

static void reopen_log(void) {
    if (log_path == NULL || log_path[0] == '\0')
        return;
    int fd = open(log_path, LOG_FLAGS, 0640);
    if (fd < 0)
        return;
    if (log_fd >= 0)
        close(log_fd);
    log_fd = fd;
}

/* --- starting the container ----------------------------------------------------------------- */

static const char *errno_name(int err) {
    switch (err) {
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EINVAL: return "EINVAL";
    case ENOEXEC: return "ENOEXEC";
    case E2BIG: return "E2BIG";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case ELOOP: return "ELOOP";
    case ENAMETOOLONG: return "ENAMETOOLONG";
    case ETXTBSY: return "ETXTBSY";
    case ENOMEM: return "ENOMEM";
    case EMFILE: return "EMFILE";
    case EAGAIN: return "EAGAIN";
    default: return "";
    }
}

/* A bind mount: SRC (host) on DST (container path), RO "0" (read-write), "1" (read-only) or "R"
 * (recursively read-only: CRI recursive_read_only), propagation "private" or "rslave" (CRI
 * PROPAGATION_PRIVATE / PROPAGATION_HOST_TO_CONTAINER). */
struct bind {
    const char *src, *dst, *ro, *propagation;
};
static struct bind *mounts;
static int nmounts;

/* mkdir -p PATH (0755); 0 or -1 with errno. */
static int mkdir_p(const char *path) {
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = c;
            if (c == '\0')
                return 0;
        }
    }
}

/* The mount point for SRC at DST: a directory for a directory, an empty file for anything else
 * (a file, a socket, a device), as runc makes them. */
static int make_mount_point(const char *src, const char *dst) {
    struct stat st;
    if (stat(src, &st) != 0)
        return -1;
    if (S_ISDIR(st.st_mode))
        return mkdir_p(dst);
    if (stat(dst, &st) == 0)
        return 0;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dst);
    char *slash = strrchr(parent, '/');
    if (slash != NULL && slash != parent) {
        *slash = '\0';
        if (mkdir_p(parent) != 0)
            return -1;
    }
    int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* <linux/mount.h>'s mount_setattr(2) (Linux 5.12), declared here: glibc's <sys/mount.h> and
 * <linux/mount.h> do not mix, and the syscall number is the same on every architecture. */
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#define PV_AT_RECURSIVE 0x8000
#define PV_MOUNT_ATTR_RDONLY 0x1
struct pv_mount_attr {
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
};

/* DST and every mount under it read-only (runc's "rro"); 0 or -1 with errno. */
static int recursive_read_only(const char *dst) {
    struct pv_mount_attr attr = {PV_MOUNT_ATTR_RDONLY, 0, 0, 0};
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, dst, PV_AT_RECURSIVE, &attr, sizeof attr);
}

/* In the container's child, before exec: a private mount namespace (nothing mounted here reaches
 * the host: "/" becomes a slave of the host's), then each bind mount in order, as runc does. A
 * missing host path is created as a directory (containerd's rule); a missing mount point is
 * created on the host's filesystem, since the container's root is the host's. Read-only: the
 * bind is remounted read-only, keeping nosuid/nodev/noexec of the filesystem underneath.
 * Returns -1 with errno and *failed the index of the mount that failed (-1: the namespace). */
static int apply_mounts(int *failed) {
    *failed = -1;
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        return -1;
    for (int i = 0; i < nmounts; i++) {
        const struct bind *m = &mounts[i];
        *failed = i;
        struct stat st;
        if (stat(m->src, &st) != 0 && (errno != ENOENT || mkdir_p(m->src) != 0))
            return -1;
        if (make_mount_point(m->src, m->dst) != 0 ||
            mount(m->src, m->dst, NULL, MS_BIND | MS_REC, NULL) != 0)
            return -1;
        unsigned long prop = strcmp(m->propagation, "rslave") == 0 ? MS_SLAVE : MS_PRIVATE;
        if (mount(NULL, m->dst, NULL, MS_REC | prop, NULL) != 0)
            return -1;
        if (strcmp(m->ro, "0") != 0) {
            struct statvfs vfs;
            unsigned long keep = 0;
            if (statvfs(m->dst, &vfs) == 0)
                keep = (vfs.f_flag & ST_NOSUID ? MS_NOSUID : 0) |
                       (vfs.f_flag & ST_NODEV ? MS_NODEV : 0) |
                       (vfs.f_flag & ST_NOEXEC ? MS_NOEXEC : 0);
            if (mount(NULL, m->dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | keep, NULL) != 0)
                return -1;
        }
        if (strcmp(m->ro, "R") == 0 && recursive_read_only(m->dst) != 0)
            return -1;
    }
    return 0;
}

/* --- the image root filesystem (engine.py _make_rootfs, monitor.py apply_rootfs) ------------- */

/* The "ROOTFS" section: MERGED UPPER WORK NLOWER LOWER... NETC (NAME SRC)... (NETC counts the
 * fields, two per file). */
static const char *rootfs_merged, *rootfs_upper, *rootfs_work;
static char **rootfs_lower, **rootfs_etc;
static char *field(char **at, const char *end);
static char **field_list(char **at, const char *end);

static int parse_rootfs(char **at, const char *end) {
    if ((rootfs_merged = field(at, end)) == NULL || (rootfs_upper = field(at, end)) == NULL ||
        (rootfs_work = field(at, end)) == NULL || (rootfs_lower = field_list(at, end)) == NULL ||
        rootfs_lower[0] == NULL || (rootfs_etc = field_list(at, end)) == NULL)
        return -1;
    return 0;
}

static const char *const rootfs_steps[] = {
    "a private mount namespace", "the overlay of the image's layers", "/proc", "/dev",
    "a device in /dev", "/sys", "an /etc file", "pivot_root", "detaching the old root"};

static int touch(const char *path) {
    struct stat st;
    if (lstat(path, &st) == 0)
        return 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* In the container's child, before the volume mounts: a private namespace, the overlay on
 * MERGED, /proc, a tmpfs /dev with the usual devices bound from the host, /sys read-only, the
 * pod's /etc files. -1 with errno and *failed the step (rootfs_steps). */
static int rootfs_prepare(int *failed) {
    char path[4096];
    *failed = 0;
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0)
        return -1;
    *failed = 1;
    size_t cap = 64;
    for (char **l = rootfs_lower; *l != NULL; l++)
        cap += strlen(*l) + 1;
    cap += strlen(rootfs_upper) + strlen(rootfs_work) + 64;
    char *opts = malloc(cap);
    if (opts == NULL)
        return -1;
    size_t n = (size_t)snprintf(opts, cap, "lowerdir=");
    for (char **l = rootfs_lower; *l != NULL; l++)
        n += (size_t)snprintf(opts + n, cap - n, "%s%s", l == rootfs_lower ? "" : ":", *l);
    snprintf(opts + n, cap - n, ",upperdir=%s,workdir=%s", rootfs_upper, rootfs_work);
    if (mount("overlay", rootfs_merged, "overlay", 0, opts) != 0)
        return -1;
    static const char *const subs[] = {"proc", "dev", "sys", "etc"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", rootfs_merged, subs[i]);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            unlink(path);
        if (mkdir_p(path) != 0)
            return -1;
    }
    *failed = 2;
    snprintf(path, sizeof path, "%s/proc", rootfs_merged);
    if (mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0)
        return -1;
    *failed = 3;
    snprintf(path, sizeof path, "%s/dev", rootfs_merged);
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID, "mode=755,size=65536k") != 0)
        return -1;
    static const char *const subdirs[] = {"pts", "shm", "mqueue"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/dev/%s", rootfs_merged, subdirs[i]);
        if (mkdir_p(path) != 0)
            return -1;
    }
    snprintf(path, sizeof path, "%s/dev/shm", rootfs_merged);
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=65536k") != 0)
        return -1;
    snprintf(path, sizeof path, "%s/dev/pts", rootfs_merged);
    mount("devpts", path, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
    static const char *const links[][2] = {
        {"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"},
        {"stderr", "/proc/self/fd/2"}, {"ptmx", "pts/ptmx"}};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/dev/%s", rootfs_merged, links[i][0]);
        symlink(links[i][1], path);
    }
    *failed = 4;
    static const char *const devices[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (int i = 0; i < 6; i++) {
        char host[64];
        snprintf(host, sizeof host, "/dev/%s", devices[i]);
        if (access(host, F_OK) != 0)
            continue;
        snprintf(path, sizeof path, "%s/dev/%s", rootfs_merged, devices[i]);
        if (touch(path) != 0 || mount(host, path, NULL, MS_BIND, NULL) != 0)
            return -1;
    }
    *failed = 5;
    snprintf(path, sizeof path, "%s/sys", rootfs_merged);
    if (mount("/sys", path, NULL, MS_BIND | MS_REC, NULL) != 0 ||
        mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV |
              MS_NOEXEC, NULL) != 0)
        return -1;
    *failed = 6;
    for (char **e = rootfs_etc; e[0] != NULL && e[1] != NULL; e += 2) {
        snprintf(path, sizeof path, "%s/etc/%s", rootfs_merged, e[0]);
        struct stat st;
        if (lstat(path, &st) == 0 && (S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)))
            continue; /* the image's own choice (resolv.conf -> ...) */
        if (touch(path) != 0 || mount(e[1], path, NULL, MS_BIND, NULL) != 0)
            return -1;
    }
    return 0;
}

/* After the volume mounts: pivot_root into MERGED and detach the old root. */
static int rootfs_pivot(int *failed) {
    *failed = 7;
    if (chdir(rootfs_merged) != 0 || syscall(SYS_pivot_root, ".", ".") != 0)
        return -1;
    *failed = 8;
    if (umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
        return -1;
    return 0;
}

/* --- the security context (security.py) ------------------------------------------------------ */

/* The "security" section of the request: UID GID NGROUPS GROUP... CAPS (hex) NNP RO_ROOT MANAGE
 * NMASKED PATH... NREADONLY PATH... ("0"/"1" flags). MANAGE 0: the runtime is not root, only
 * no_new_privs is applied. */
struct security {
    int present;
    uid_t uid;
    gid_t gid;
    gid_t *groups;
    int ngroups;
    unsigned long long caps;
    int nnp, ro_root, manage;
    char **masked, **readonly;
};
static struct security sec;

/* <linux/capability.h>, without a libcap dependency: capset(2) with version 3 (64-bit sets). */
struct cap_header {
    unsigned int version;
    int pid;
};
struct cap_data {
    unsigned int effective, permitted, inheritable;
};
#define CAP_VERSION_3 0x20080522

static char *field(char **at, const char *end);
static char **field_list(char **at, const char *end);

static int parse_security(char **at, const char *end) {
    char *uid = field(at, end), *gid = field(at, end);
    char **groups = field_list(at, end);
    char *caps = field(at, end), *nnp = field(at, end), *ro = field(at, end);
    char *manage = field(at, end);
    if (uid == NULL || gid == NULL || groups == NULL || caps == NULL || nnp == NULL ||
        ro == NULL || manage == NULL)
        return -1;
    sec.uid = (uid_t)strtoul(uid, NULL, 10);
    sec.gid = (gid_t)strtoul(gid, NULL, 10);
    for (sec.ngroups = 0; groups[sec.ngroups] != NULL; sec.ngroups++) {
    }
    sec.groups = calloc((size_t)sec.ngroups + 1, sizeof *sec.groups);
    if (sec.groups == NULL)
        return -1;
    for (int i = 0; i < sec.ngroups; i++)
        sec.groups[i] = (gid_t)strtoul(groups[i], NULL, 10);
    sec.caps = strtoull(caps, NULL, 16);
    sec.nnp = strcmp(nnp, "1") == 0;
    sec.ro_root = strcmp(ro, "1") == 0;
    sec.manage = strcmp(manage, "1") == 0;
    if ((sec.masked = field_list(at, end)) == NULL || (sec.readonly = field_list(at, end)) == NULL)
        return -1;
    sec.present = 1;
    return 0;
}

/* Keep nosuid/nodev/noexec of what is mounted at PATH in a read-only remount. */
static unsigned long kept_flags(const char *path) {
    struct statvfs vfs;
    if (statvfs(path, &vfs) != 0)
        return 0;
    return (vfs.f_flag & ST_NOSUID ? MS_NOSUID : 0) | (vfs.f_flag & ST_NODEV ? MS_NODEV : 0) |
           (vfs.f_flag & ST_NOEXEC ? MS_NOEXEC : 0);
}

static int count(char **list) {
    int n = 0;
    while (list != NULL && list[n] != NULL)
        n++;
    return n;
}

/* In the container's child, after apply_mounts: masked paths (/dev/null over a file, a
 * read-only tmpfs over a directory), read-only paths (a read-only bind of themselves) and the
 * read-only root, as runc does them, in the container's private mount namespace (made here when
 * there were no volume mounts). A missing path is skipped (runc's rule). -1 with errno and
 * *failed: -1 the namespace, then the masked paths, the read-only paths, and the root. */
static int apply_security_mounts(int *failed) {
    int nmasked = count(sec.masked), nro = count(sec.readonly);
    *failed = -1;
    if (!sec.present || (!sec.ro_root && nmasked == 0 && nro == 0))
        return 0;
    if (nmounts == 0 &&
        (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0))
        return -1;
    for (int i = 0; i < nmasked; i++) { /* runc's maskPath: no stat, one mount for a file */
        const char *p = sec.masked[i];
        *failed = i;
        if (mount("/dev/null", p, NULL, MS_BIND, NULL) == 0 || errno == ENOENT)
            continue;
        if (errno != ENOTDIR || mount("tmpfs", p, "tmpfs", MS_RDONLY, NULL) != 0)
            return -1;
    }
    for (int i = 0; i < nro; i++) {
        const char *p = sec.readonly[i];
        *failed = nmasked + i;
        if (mount(p, p, NULL, MS_BIND | MS_REC, NULL) != 0) {
            if (errno == ENOENT)
                continue;
            return -1;
        }
        if (mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | kept_flags(p), NULL) != 0)
            return -1;
    }
    *failed = nmasked + nro;
    if (sec.ro_root &&
        mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | kept_flags("/"), NULL) != 0)
        return -1;
    return 0;
}

static const char *security_mount_name(int i) {
    int nmasked = count(sec.masked), nro = count(sec.readonly);
    if (i < 0)
        return "a private mount namespace for the container's masked and read-only paths";
    if (i < nmasked)
        return sec.masked[i];
    if (i < nmasked + nro)
        return sec.readonly[i - nmasked];
    return "the read-only root filesystem";
}

static const char *const security_steps[] = {
    "dropping capabilities from the bounding set", "setgroups", "setgid", "setuid", "capset",
    "no_new_privs"};

/* In the container's child, right before exec: the bounding set (while CAP_SETPCAP is held),
 * groups, gid, uid (in this order: each needs the privilege the next drops), then for root the
 * effective/permitted sets (inheritable cleared, as runc does now); a non-root uid lost them all
 * at setresuid (no SECBIT_KEEP_CAPS), so exec gives it none. Last no_new_privs. -1 with errno and
 * *failed the step (security_steps). */
static int apply_security(int *failed) {
    if (!sec.present)
        return 0;
    if (sec.manage) {
        *failed = 0;
        for (int cap = 0; cap < 64; cap++) {
            int have = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
            if (have < 0)
                break; /* past the kernel's last capability */
            if (have == 1 && !(sec.caps >> cap & 1ULL) &&
                prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
                return -1;
        }
        *failed = 1;
        if (setgroups((size_t)sec.ngroups, sec.groups) != 0)
            return -1;
        *failed = 2;
        if (setresgid(sec.gid, sec.gid, sec.gid) != 0)
            return -1;
        *failed = 3;
        if (setresuid(sec.uid, sec.uid, sec.uid) != 0)
            return -1;
        if (sec.uid == 0) {
            struct cap_header head = {CAP_VERSION_3, 0};
            struct cap_data data[2];
            memset(data, 0, sizeof data);
            data[0].effective = data[0].permitted = (unsigned int)(sec.caps & 0xffffffffULL);
            data[1].effective = data[1].permitted = (unsigned int)(sec.caps >> 32);
            *failed = 4;
            if (syscall(SYS_capset, &head, data) != 0)
                return -1;
        }
    }
    *failed = 5;
    if (sec.nnp && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return 0;
}

/* --- stdin, a terminal and attach (engine.py _stdio; stream_attach.py) ---------------------- */

/* The "STDIO" STDIN STDIN_ONCE TTY PATH section (CRI's stdin, stdin_once, tty): the container's
 * stdin is a pipe (or, with TTY, its stdin/stdout/stderr are a pty's slave and the master's
 * output is its stdout), fed from attach clients on the unix socket PATH (mode 0600, one client
 * at a time). A client sends frames: a type byte, a 2-byte big-endian length, the payload:
 * 'd' stdin data, 'c' end of stdin, 'r' "COLS ROWS" (the terminal's size). With STDIN_ONCE
 * stdin is closed when the first client goes away. Ending stdin closes the pipe; on a terminal
 * it types ^D, as a user would. Writes never block the monitor: the data waits (and the client
 * is not read) until the container reads it. */
#define STDIN_BUFFER 65536
static int io_stdin, io_stdin_once, io_tty;
static const char *attach_path;
static char tty_slave[128];

static int parse_stdio(char **at, const char *end) {
    char *in = field(at, end), *once = field(at, end), *tty = field(at, end);
    if (in == NULL || once == NULL || tty == NULL || (attach_path = field(at, end)) == NULL)
        return -1;
    io_stdin = strcmp(in, "1") == 0;
    io_stdin_once = strcmp(once, "1") == 0;
    io_tty = strcmp(tty, "1") == 0;
    return 0;
}

/* The attach socket, listening before the container starts; -1 with errno. */
static int attach_listen(void) {
    struct sockaddr_un addr;
    if (strlen(attach_path) >= sizeof addr.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strcpy(addr.sun_path, attach_path);
    unlink(attach_path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || chmod(attach_path, 0600) != 0 ||
        listen(fd, 4) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

/* The monitor's side of the container's stdin while it runs. */
struct stdin_feed {
    int listen_fd, client, fd; /* fd: the pipe's write end or the pty master (-1: closed) */
    int ended;                 /* stdin ended: close once what waits is written */
    char pending[STDIN_BUFFER];
    size_t npending;
    unsigned char frame[3 + 65535];
    size_t nframe;
};

static void stdin_end(struct stdin_feed *f) {
    if (f->client >= 0) { /* its writes fail now, rather than wait for a reader */
        close(f->client);
        f->client = -1;
        f->nframe = 0;
    }
    if (f->fd < 0)
        return;
    if (io_tty)
        write(f->fd, "\x04", 1); /* ^D; the master stays: it is the container's output */
    else
        close(f->fd);
    f->fd = -1;
    f->npending = 0;
}

static void stdin_flush(struct stdin_feed *f) {
    while (f->fd >= 0 && f->npending > 0) {
        ssize_t n = write(f->fd, f->pending, f->npending);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) { /* EPIPE: the container closed its stdin */
            stdin_end(f);
            return;
        }
        memmove(f->pending, f->pending + n, f->npending - (size_t)n);
        f->npending -= (size_t)n;
    }
    if (f->ended && f->npending == 0)
        stdin_end(f);
}

static void client_gone(struct stdin_feed *f) {
    close(f->client);
    f->client = -1;
    f->nframe = 0;
    if (io_stdin_once)
        f->ended = 1;
    stdin_flush(f);
}

/* Read what the client sent and act on each whole frame. */
static void client_read(struct stdin_feed *f) {
    ssize_t n = read(f->client, f->frame + f->nframe, sizeof f->frame - f->nframe);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        client_gone(f);
        return;
    }
    f->nframe += (size_t)n;
    for (;;) {
        if (f->nframe < 3)
            return;
        size_t len = ((size_t)f->frame[1] << 8) | f->frame[2];
        if (f->nframe < 3 + len || f->npending + len > sizeof f->pending)
            return; /* the rest of the frame, or room for it, later */
        char type = (char)f->frame[0];
        if (type == 'd' && f->fd >= 0 && !f->ended) {
            memcpy(f->pending + f->npending, f->frame + 3, len);
            f->npending += len;
        } else if (type == 'c') {
            f->ended = 1;
        } else if (type == 'r' && io_tty && f->fd >= 0 && len < 32) {
            char size[32];
            memcpy(size, f->frame + 3, len);
            size[len] = '\0';
            struct winsize ws = {0};
            unsigned cols = 0, rows = 0;
            if (sscanf(size, "%u %u", &cols, &rows) == 2 && cols > 0 && rows > 0 &&
                cols < 65536 && rows < 65536) {
                ws.ws_col = (unsigned short)cols;
                ws.ws_row = (unsigned short)rows;
                ioctl(f->fd, TIOCSWINSZ, &ws);
            }
        }
        memmove(f->frame, f->frame + 3 + len, f->nframe - 3 - len);
        f->nframe -= 3 + len;
        stdin_flush(f);
    }
}

static void attach_accept(struct stdin_feed *f) {
    int c = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0)
        return;
    if (f->client >= 0) { /* one client at a time */
        close(c);
        return;
    }
    f->client = c;
}

static struct stdin_feed feed_state = {-1, -1, -1, 0, {0}, 0, {0}, 0};

/* --- the pod's hostname (engine.py _pod_hostname) ------------------------------------------- */

/* The "HOSTNAME" NAME section: a pod with a network of its own has its own hostname; the child
 * makes a UTS namespace and sets it, first (runc sets it in the container's namespaces). */
static const char *uts_hostname;

static int apply_hostname(void) {
    if (unshare(CLONE_NEWUTS) != 0)
        return -1;
    return sethostname(uts_hostname, strlen(uts_hostname));
}

/* --- seccomp (seccomp.py) ------------------------------------------------------------------- */

/* The "SECCOMP" section: DEFAULT NARCH ARCH... NATTR (ATTR VALUE)... NRULES then per rule NAME
 * ACTION NCOND (INDEX OP VALUE VALUE_TWO)...: runc's InitSeccomp made data by the runtime
 * (action and operator numbers are libseccomp's, architectures its names). The filter is built
 * in the monitor before the fork (build_seccomp: a bad rule fails the start with its reason)
 * and loaded by the container's child right before exec (load_seccomp). */
#define MAX_SCMP_ARGS 6
struct scmp_rule {
    const char *name;
    unsigned int action;
    int nargs;
    unsigned int index[MAX_SCMP_ARGS], op[MAX_SCMP_ARGS];
    unsigned long long value[MAX_SCMP_ARGS], value_two[MAX_SCMP_ARGS];
};
static int seccomp_present;
static unsigned int seccomp_default;
static char **seccomp_arches, **seccomp_attrs;
static struct scmp_rule *seccomp_rules;
static long nseccomp_rules;

static int parse_seccomp(char **at, const char *end) {
    char *def = field(at, end), *count;
    if (def == NULL || (seccomp_arches = field_list(at, end)) == NULL ||
        (seccomp_attrs = field_list(at, end)) == NULL || (count = field(at, end)) == NULL)
        return -1;
    seccomp_default = (unsigned int)strtoul(def, NULL, 10);
    nseccomp_rules = strtol(count, NULL, 10);
    if (nseccomp_rules < 0 || nseccomp_rules > (end - *at) / 3)
        return -1;
    seccomp_rules = calloc((size_t)nseccomp_rules + 1, sizeof *seccomp_rules);
    if (seccomp_rules == NULL)
        return -1;
    for (long i = 0; i < nseccomp_rules; i++) {
        struct scmp_rule *r = &seccomp_rules[i];
        char *action, *nargs;
        if ((r->name = field(at, end)) == NULL || (action = field(at, end)) == NULL ||
            (nargs = field(at, end)) == NULL)
            return -1;
        r->action = (unsigned int)strtoul(action, NULL, 10);
        r->nargs = atoi(nargs);
        if (r->nargs < 0 || r->nargs > MAX_SCMP_ARGS)
            return -1;
        for (int j = 0; j < r->nargs; j++) {
            char *index = field(at, end), *op = field(at, end), *v = field(at, end);
            char *v2 = field(at, end);
            if (index == NULL || op == NULL || v == NULL || v2 == NULL)
                return -1;
            r->index[j] = (unsigned int)strtoul(index, NULL, 10);
            r->op[j] = (unsigned int)strtoul(op, NULL, 10);
            r->value[j] = strtoull(v, NULL, 10);
            r->value_two[j] = strtoull(v2, NULL, 10);
        }
    }
    seccomp_present = 1;
    return 0;
}

#ifdef PV_SECCOMP
static scmp_filter_ctx seccomp_ctx;

/* Build the filter (in the monitor, before the fork); -1 with errno and WHAT the failing step. */
static int build_seccomp(char *what, size_t cap) {
    snprintf(what, cap, "seccomp_init");
    seccomp_ctx = seccomp_init(seccomp_default);
    if (seccomp_ctx == NULL) {
        errno = ENOMEM;
        return -1;
    }
    for (char **a = seccomp_arches; *a != NULL; a++) {
        snprintf(what, cap, "architecture %s", *a);
        uint32_t arch = seccomp_arch_resolve_name(*a);
        if (arch == 0) {
            errno = EINVAL;
            return -1;
        }
        int rc = seccomp_arch_add(seccomp_ctx, arch);
        if (rc != 0 && rc != -EEXIST) {
            errno = -rc;
            return -1;
        }
    }
    for (char **a = seccomp_attrs; a[0] != NULL && a[1] != NULL; a += 2) {
        snprintf(what, cap, "filter attribute %s", a[0]);
        int rc = seccomp_attr_set(seccomp_ctx, (enum scmp_filter_attr)atoi(a[0]),
                                  (uint32_t)strtoul(a[1], NULL, 10));
        if (rc != 0) {
            errno = -rc;
            return -1;
        }
    }
    for (long i = 0; i < nseccomp_rules; i++) {
        const struct scmp_rule *r = &seccomp_rules[i];
        int nr = seccomp_syscall_resolve_name(r->name);
        if (nr == __NR_SCMP_ERROR)
            continue; /* a syscall this kernel does not know: skipped, as runc does */
        struct scmp_arg_cmp cmp[MAX_SCMP_ARGS];
        for (int j = 0; j < r->nargs; j++) {
            cmp[j].arg = r->index[j];
            cmp[j].op = (enum scmp_compare)r->op[j];
            cmp[j].datum_a = r->value[j];
            cmp[j].datum_b = r->value_two[j];
        }
        snprintf(what, cap, "the rule for %s", r->name);
        int rc = seccomp_rule_add_array(seccomp_ctx, r->action, nr, (unsigned int)r->nargs, cmp);
        if (rc != 0) {
            errno = -rc;
            return -1;
        }
    }
    return 0;
}

/* In the container's child: load the filter built before the fork. */
static int load_seccomp(void) {
    int rc = seccomp_load(seccomp_ctx);
    if (rc != 0) {
        errno = -rc;
        return -1;
    }
    return 0;
}
#else
static int build_seccomp(char *what, size_t cap) {
    snprintf(what, cap, "this monitor was built without libseccomp");
    errno = ENOSYS;
    return -1;
}

static int load_seccomp(void) {
    errno = ENOSYS;
    return -1;
}
#endif

/* --- cgroups (cgroups.py) ------------------------------------------------------------------- */

/* The files the container's process writes itself into (cgroups.py join_files: v1 <dir>/tasks,
 * v2 <dir>/cgroup.procs), from the request's CGROUPS section. */
static char **cgroup_files;
static int ncgroups;

/* In the container's child, first thing before exec: move this process into each of the
 * container's cgroups (write "0", "myself", into each file), so everything the command does
 * from its first instruction is counted and limited. Returns -1 with errno and *failed the
 * index of the file that failed. */
static int join_cgroups(int *failed) {
    for (int i = 0; i < ncgroups; i++) {
        *failed = i;
        int fd = open(cgroup_files[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return -1;
        ssize_t n = write(fd, "0", 1);
        int saved = errno;
        close(fd);
        if (n != 1) {
            errno = n < 0 ? saved : EIO;
            return -1;
        }
    }
    return 0;
}

/* --- oom_score_adj (oom.py) ------------------------------------------------------------------ */

/* The request's "OOM" VALUE section: the container's oom_score_adj (clamped by the runtime,
 * oom.py effective), written by the child itself before the exec (and before it changes its
 * uid: a process whose ids changed is not dumpable, its /proc files belong to root), so the
 * command has its value from its first instruction, as runc writes it in its init. */
static const char *oom_score_adj;

static int write_oom_score_adj(void) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = strlen(oom_score_adj);
    ssize_t n = write(fd, oom_score_adj, len);
    int saved = errno;
    close(fd);
    if (n != (ssize_t)len) {
        errno = n < 0 ? saved : EIO;
        return -1;
    }
    return 0;
}

/* --- the pod's network namespace (netns.py, cni.py) -------------------------------------- */

/* The request's "NETNS" PATH section: the sandbox's network namespace (a bind-mounted nsfs
 * file), joined by the container's process before its exec, as runc joins the namespaces the
 * OCI spec names by path. */
static const char *netns_path;

static int join_netns(void) {
    int fd = open(netns_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* Child side of the fork: never returns. Reports (stage, errno, mount index) on report_w if
 * the mounts, the chdir or the exec fail. MONITOR is the parent's pid. */
static void exec_container(const char *cwd, char **argv, int out_w, int err_w, int report_w,
                           pid_t monitor, int stdin_r) {
    if (io_tty) { /* a session of its own whose controlling terminal is the pty's slave */
        setsid();
        int slave = open(tty_slave, O_RDWR);
        if (slave < 0 || ioctl(slave, TIOCSCTTY, 0) != 0) {
            int report[3] = {11, errno, -1};
            write_all(report_w, (const char *)report, sizeof report);
            _exit(127);
        }
        dup2(slave, 0);
        dup2(slave, 1);
        dup2(slave, 2);
        if (slave > 2)
            close(slave);
    } else {
        int in = stdin_r >= 0 ? stdin_r : open("/dev/null", O_RDONLY);
        if (in >= 0 && in != 0) {
            dup2(in, 0);
            close(in);
        }
        dup2(out_w, 1);
        dup2(err_w, 2);
        setsid();
    }
    sigset_t none;
    sigemptyset(&none);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int report[3] = {0, 0, -1};
    if (ncgroups > 0 && join_cgroups(&report[2]) != 0) {
        report[0] = 7;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (oom_score_adj != NULL && write_oom_score_adj() != 0) {
        report[0] = 8;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (netns_path != NULL && join_netns() != 0) {
        report[0] = 12;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (uts_hostname != NULL && apply_hostname() != 0) {
        report[0] = 10;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (rootfs_merged != NULL && rootfs_prepare(&report[2]) != 0) {
        report[0] = 6;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (nmounts > 0 && apply_mounts(&report[2]) != 0) {
        report[0] = 3;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (rootfs_merged != NULL && rootfs_pivot(&report[2]) != 0) {
        report[0] = 6;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (apply_security_mounts(&report[2]) != 0) {
        report[0] = 4;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (chdir(cwd) != 0) {
        report[0] = 1;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    /* Seccomp as runc orders it: without no_new_privs loading a filter needs CAP_SYS_ADMIN, so
     * before the ids and capabilities change; with it, as late as possible. */
    if (seccomp_present && !sec.nnp && load_seccomp() != 0) {
        report[0] = 9;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    if (apply_security(&report[2]) != 0) {
        report[0] = 5;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    /* The container's process dies with its monitor, whatever killed the monitor and when: a
     * monitor gone before it recorded started.json leaves no process that no record names
     * (engine.py _settle). Set last, since a change of ids clears it; the getppid check closes
     * the window of a monitor that died before the prctl. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != monitor)
        _exit(127);
    if (seccomp_present && sec.nnp && load_seccomp() != 0) {
        report[0] = 9;
        report[1] = errno;
        write_all(report_w, (const char *)report, sizeof report);
        _exit(127);
    }
    execvp(argv[0], argv); /* PATH from environ: the container's environment */
    report[0] = 2;
    report[1] = errno;
    write_all(report_w, (const char *)report, sizeof report);
    _exit(127);
}

static void reply_error(int reply_fd, const char *fmt, ...) {
    char msg[2048], esc[4200], out[4300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_escape(esc, sizeof esc, msg);
    int n = snprintf(out, sizeof out, "{\"ok\": false, \"error\": \"%s\"}", esc);
    if (reply_fd >= 0)
        write_all(reply_fd, out, (size_t)n);
}

/* fork + exec; returns the pid, or -1 after replying the error. */
static pid_t start(const char *cwd, char **argv, int reply_fd, int *out_r, int *err_r) {
    int out[2], err[2], rep[2];
    if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(rep, O_CLOEXEC)) {
        reply_error(reply_fd, "pipe: %s (errno %d)", strerror(errno), errno);
        return -1;
    }
    char what[300];
    if (seccomp_present && build_seccomp(what, sizeof what) != 0) {
        reply_error(reply_fd, "security context: seccomp filter: %s: %s (errno %d %s)", what,
                    strerror(errno), errno, errno_name(errno));
        return -1;
    }
    int in[2] = {-1, -1};
    if (attach_path != NULL && (io_stdin || io_tty)) {
        if ((feed_state.listen_fd = attach_listen()) < 0) {
            reply_error(reply_fd, "the container's attach socket %s: %s (errno %d %s)",
                        attach_path, strerror(errno), errno, errno_name(errno));
            return -1;
        }
        if (io_tty) {
            int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
            if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0 ||
                ptsname_r(master, tty_slave, sizeof tty_slave) != 0) {
                reply_error(reply_fd, "the container's terminal: %s (errno %d %s)",
                            strerror(errno), errno, errno_name(errno));
                return -1;
            }
            fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
            feed_state.fd = master;
        } else {
            if (pipe2(in, O_CLOEXEC) != 0) {
                reply_error(reply_fd, "pipe: %s (errno %d)", strerror(errno), errno);
                return -1;
            }
            fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
            feed_state.fd = in[1];
        }
    }
    pid_t monitor = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        reply_error(reply_fd, "fork: %s (errno %d)", strerror(errno), errno);
        return -1;
    }
    if (pid == 0) {
        close(out[0]);
        close(err[0]);
        close(rep[0]);
        exec_container(cwd, argv, out[1], err[1], rep[1], monitor, in[0]);
    }
    if (in[0] >= 0)
        close(in[0]);
    close(out[1]);
    close(err[1]);
    close(rep[1]);
    int report[3];
    ssize_t n;
    do {
        n = read(rep[0], report, sizeof report);
    } while (n < 0 && errno == EINTR);
    close(rep[0]);
    if (n == (ssize_t)sizeof report) { /* exec failed: the child reported before exiting */
        waitpid(pid, NULL, 0);
        close(out[0]);
        close(err[0]);
        if (report[0] == 11) {
            reply_error(reply_fd, "the container's terminal %s: %s (errno %d %s)", tty_slave,
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 6) {
            reply_error(reply_fd, "image root filesystem: %s: %s (errno %d %s)",
                        rootfs_steps[report[2] >= 0 && report[2] < 9 ? report[2] : 0],
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 7) {
            reply_error(reply_fd, "join cgroup \"%s\": %s (errno %d %s)", cgroup_files[report[2]],
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 3 && report[2] < 0) {
            reply_error(reply_fd, "a private mount namespace for the container's mounts: "
                        "%s (errno %d %s)", strerror(report[1]), report[1],
                        errno_name(report[1]));
        } else if (report[0] == 3) {
            const struct bind *m = &mounts[report[2]];
            reply_error(reply_fd, "mount \"%s\" on \"%s\"%s: %s (errno %d %s)", m->src, m->dst,
                        strcmp(m->ro, "R") == 0   ? " recursively read-only"
                        : strcmp(m->ro, "1") == 0 ? " read-only"
                                                  : "",
                        strerror(report[1]),
                        report[1], errno_name(report[1]));
        } else if (report[0] == 4) {
            reply_error(reply_fd, "security context: mounting %s: %s (errno %d %s)",
                        security_mount_name(report[2]), strerror(report[1]), report[1],
                        errno_name(report[1]));
        } else if (report[0] == 5) {
            reply_error(reply_fd, "security context: %s: %s (errno %d %s)",
                        security_steps[report[2] >= 0 && report[2] < 6 ? report[2] : 5],
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 12) {
            reply_error(reply_fd, "join network namespace \"%s\": %s (errno %d %s)", netns_path,
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 10) {
            reply_error(reply_fd, "the pod's hostname \"%s\" (a UTS namespace of its own): %s "
                        "(errno %d %s)", uts_hostname, strerror(report[1]), report[1],
                        errno_name(report[1]));
        } else if (report[0] == 9) {
            reply_error(reply_fd, "security context: seccomp: %s (errno %d %s)",
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 8) {
            reply_error(reply_fd, "oom_score_adj %s: %s (errno %d %s)", oom_score_adj,
                        strerror(report[1]), report[1], errno_name(report[1]));
        } else if (report[0] == 1) {
            reply_error(reply_fd, "chdir '%s': %s (errno %d)", cwd, strerror(report[1]),
                        report[1]);
        } else {
            reply_error(reply_fd, "exec \"%s\": %s (errno %d %s)", argv[0],
                        strerror(report[1]), report[1], errno_name(report[1]));
        }
        return -1;
    }
    if (io_tty) { /* the terminal's output is the container's stdout */
        close(out[0]);
        *out_r = feed_state.fd;
    } else {
        *out_r = out[0];
    }
    *err_r = err[0];
    return pid;
}

/* --- the watch loop ------------------------------------------------------------------------- */

static int exit_code_of(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 255;
}

static void pump(pid_t pid, int out_r, int err_r, int *code, long long *finished) {
    static struct stream out, err;
    out.fd = out_r;
    out.name = "stdout";
    err.fd = err_r;
    err.name = "stderr";
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int exited = 0, open_streams = 2;
    long long deadline = 0;
    char buf[65536];
    struct stdin_feed *sf = &feed_state;
    while (open_streams > 0 || !exited) {
        int feeding = !exited && sf->fd >= 0;
        struct pollfd fds[7] = {
            {out.fd, POLLIN, 0}, {err.fd, POLLIN, 0}, {pidfd, POLLIN, 0}, {sigfd, POLLIN, 0},
            {feeding ? sf->listen_fd : -1, POLLIN, 0},
            {feeding && sf->npending == 0 ? sf->client : -1, POLLIN, 0},
            {feeding && sf->npending > 0 && !io_tty ? sf->fd : -1, POLLOUT, 0}};
        int timeout = -1;
        if (exited) {
            long long left = (deadline - now_ns(CLOCK_MONOTONIC)) / 1000000;
            if (left <= 0)
                break;
            timeout = (int)left;
        } else if (pidfd < 0) {
            timeout = 100; /* no pidfd (old kernel): poll waitpid */
        }
        if (feeding && io_tty && sf->npending > 0 && timeout < 0)
            timeout = 10; /* the master's POLLOUT is its output's fd too: retry the write */
        int n = poll(fds, 7, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (fds[4].revents & POLLIN)
            attach_accept(sf);
        if (fds[5].revents & (POLLIN | POLLHUP | POLLERR))
            client_read(sf);
        if ((fds[6].revents & (POLLOUT | POLLERR)) || (io_tty && sf->npending > 0))
            stdin_flush(sf);
        if (!exited && (pidfd < 0 || (fds[2].revents & POLLIN))) {
            int status;
            pid_t got = waitpid(pid, &status, pidfd < 0 ? WNOHANG : 0);
            if (got == pid) {
                *code = exit_code_of(status);
                *finished = now_ns(CLOCK_REALTIME);
                exited = 1;
                kill(-pid, SIGKILL); /* the rest of the container's group */
                deadline = now_ns(CLOCK_MONOTONIC) + DRAIN_AFTER_EXIT_MS * 1000000LL;
                if (pidfd >= 0) {
                    close(pidfd);
                    pidfd = -1;
                }
            }
        }
        if (sigfd >= 0 && (fds[3].revents & POLLIN)) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) > 0) {
            }
            reopen_log();
        }
        struct stream *streams[2] = {&out, &err};
        for (int i = 0; i < 2; i++) {
            struct stream *s = streams[i];
            if (s->fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t got = read(s->fd, buf, sizeof buf);
            if (got > 0) {
                feed(s, buf, (size_t)got, 0);
            } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
                feed(s, "", 0, 1);
                if (s->fd == sf->fd) /* the terminal's master: no stdin past its output */
                    sf->fd = -1;
                close(s->fd);
                s->fd = -1;
                open_streams--;
            }
        }
        if (open_streams == 0 && !exited) {
            int status;
            if (waitpid(pid, &status, 0) == pid) {
                *code = exit_code_of(status);
                *finished = now_ns(CLOCK_REALTIME);
            }
            exited = 1;
        }
    }
}

/* The monitor's whole life once handed a container (state_prefix, log_fd and log_path set):
 * start ARGV, record started.json, reply, copy the output, record exit.json, send the note. */
static int run_monitor(int reply_fd, const char *cwd, const char *notify, char **cargv) {
    prctl(PR_SET_NAME, "pv-monitor"); /* what ps -o comm / top show */
    setsid();
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
    }
    if (reply_fd >= 0)
        fcntl(reply_fd, F_SETFD, FD_CLOEXEC);
    if (log_fd >= 0)
        fcntl(log_fd, F_SETFD, FD_CLOEXEC);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);

    int out_r, err_r;
    pid_t pid = start(cwd, cargv, reply_fd, &out_r, &err_r);
    if (pid < 0)
        return 0;
    if (hold_fifo != NULL && *hold_fifo != '\0') { /* tests only: see hold_fifo */
        int fd = open(hold_fifo, O_RDONLY | O_CLOEXEC);
        char drain[64];
        while (fd >= 0 && read(fd, drain, sizeof drain) > 0)
            ;
        if (fd >= 0)
            close(fd);
    }
    char started[512];
    snprintf(started, sizeof started,
             "{\"monitor_pid\": %d, \"monitor_ticks\": %llu, \"pid\": %d, \"pid_ticks\": %llu, "
             "\"started_at\": %lld}",
             (int)getpid(), start_ticks(getpid()), (int)pid, start_ticks(pid),
             now_ns(CLOCK_REALTIME));
    /* Durable before the caller hears "started" (see monitor.py); a new file written by one
     * write needs no tmp + rename. A start that cannot be recorded did not happen: a runtime
     * restarted later would not know the process (engine.py _settle). */
    if (write_file_new("started.json", started) != 0) {
        int saved = errno;
        kill(-pid, SIGKILL);
        waitpid(pid, NULL, 0);
        reply_error(reply_fd, "recording the container's start in %s.started.json: %s "
                    "(errno %d %s)", state_prefix, strerror(saved), saved, errno_name(saved));
        return 0;
    }
    if (reply_fd >= 0) {
        char reply[600];
        int n = snprintf(reply, sizeof reply, "{\"ok\": true, %s", started + 1);
        write_all(reply_fd, reply, (size_t)n);
        close(reply_fd);
    }
    int code = 255;
    long long finished = now_ns(CLOCK_REALTIME);
    pump(pid, out_r, err_r, &code, &finished);
    if (feed_state.listen_fd >= 0) { /* no attach past the container */
        close(feed_state.listen_fd);
        unlink(attach_path);
    }
    char exitrec[256];
    snprintf(exitrec, sizeof exitrec,
             "{\"exit_code\": %d, \"finished_at\": %lld, \"reason\": \"%s\", \"message\": \"\"}",
             code, finished, code == 0 ? "Completed" : "Error");
    /* Output drained first, exit.json next (the durable record), then the note. */
    write_file_atomic("exit.json", exitrec);
    const char *slash = strrchr(state_prefix, '/');
    char id[512], note[1024];
    json_escape(id, sizeof id, slash ? slash + 1 : state_prefix);
    snprintf(note, sizeof note, "{\"id\": \"%s\", %s", id, exitrec + 1);
    send_note(notify, note);
    return 0;
}

/* --- spares and the zygote ------------------------------------------------------------------ */

static int read_exact(int fd, char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = read(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Next NUL-terminated field of the request body, or NULL past its end. */
static char *field(char **at, const char *end) {
    char *f = *at;
    if (f >= end)
        return NULL;
    char *nul = memchr(f, '\0', (size_t)(end - f));
    if (nul == NULL)
        return NULL;
    *at = nul + 1;
    return f;
}

/* N, then N fields, as a NULL-terminated array; NULL when the body is malformed. */
static char **field_list(char **at, const char *end) {
    char *count = field(at, end);
    if (count == NULL)
        return NULL;
    long n = strtol(count, NULL, 10);
    if (n < 0 || n > (end - *at))
        return NULL;
    char **list = calloc((size_t)n + 1, sizeof *list);
    if (list == NULL)
        return NULL;
    for (long i = 0; i < n; i++)
        if ((list[i] = field(at, end)) == NULL)
            return NULL;
    return list;
}

/* MOUNTC, then SRC DST RO PROPAGATION per mount, into mounts/nmounts; -1 when malformed. */
static int parse_mounts(char **at, const char *end) {
    char *count = field(at, end);
    if (count == NULL)
        return -1;
    long n = strtol(count, NULL, 10);
    if (n < 0 || n > (end - *at) / 4)
        return -1;
    mounts = calloc((size_t)n + 1, sizeof *mounts);
    if (mounts == NULL)
        return -1;
    for (long i = 0; i < n; i++) {
        struct bind *m = &mounts[i];
        if ((m->src = field(at, end)) == NULL || (m->dst = field(at, end)) == NULL ||
            (m->ro = field(at, end)) == NULL || (m->propagation = field(at, end)) == NULL)
            return -1;
    }
    nmounts = (int)n;
    return 0;
}

/* "CGROUPS" N FILE... after the mounts; -1 when malformed. */
static int parse_cgroups(char **at, const char *end) {
    cgroup_files = field_list(at, end);
    if (cgroup_files == NULL)
        return -1;
    while (cgroup_files[ncgroups] != NULL)
        ncgroups++;
    return 0;
}

/* A pre-forked monitor waiting on CONN for its container: an 8-byte big-endian length with
 * the fds (reply pipe, log file or none) over SCM_RIGHTS, then the body, NUL-separated fields:
 * DIR NOTIFY CWD LOG_PATH ARGC ARGV... ENVC ENV... [MOUNTC (SRC DST RO PROPAGATION)...]. EOF
 * first (the runtime closed our socket or exited) means: never used, exit. */
static int spare_main(int conn) {
    unsigned char header[8];
    char cbuf[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {header, sizeof header};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    ssize_t got;
    do {
        got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    } while (got < 0 && errno == EINTR);
    if (got <= 0)
        return 0;
    int fds[4] = {-1, -1, -1, -1}, nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(fds, CMSG_DATA(c), (size_t)nfds * sizeof(int));
        }
    }
    if ((size_t)got < sizeof header &&
        read_exact(conn, (char *)header + got, sizeof header - (size_t)got) < 0)
        return 0;
    unsigned long long len = 0;
    for (int i = 0; i < 8; i++)
        len = (len << 8) | header[i];
    if (len == 0 || len > MAX_REQUEST)
        return 70;
    char *body = malloc((size_t)len);
    if (body == NULL || read_exact(conn, body, (size_t)len) < 0)
        return 70;
    close(conn);
    char *at = body, *end = body + len;
    state_prefix = field(&at, end);
    const char *notify = field(&at, end);
    const char *cwd = field(&at, end);
    log_path = field(&at, end);
    char **cargv = field_list(&at, end);
    char **cenv = field_list(&at, end);
    if (state_prefix == NULL || notify == NULL || cwd == NULL || log_path == NULL ||
        cargv == NULL || cargv[0] == NULL || cenv == NULL)
        return 70;
    if (at < end && parse_mounts(&at, end) != 0)
        return 70;
    while (at < end) { /* keyed sections after the mounts */
        const char *key = field(&at, end);
        if (key == NULL)
            return 70;
        if (strcmp(key, "security") == 0) {
            if (parse_security(&at, end) != 0)
                return 70;
        } else if (strcmp(key, "CGROUPS") == 0) {
            if (parse_cgroups(&at, end) != 0)
                return 70;
        } else if (strcmp(key, "OOM") == 0) {
            if ((oom_score_adj = field(&at, end)) == NULL)
                return 70;
        } else if (strcmp(key, "NETNS") == 0) {
            if ((netns_path = field(&at, end)) == NULL)
                return 70;
        } else if (strcmp(key, "ROOTFS") == 0) {
            if (parse_rootfs(&at, end) != 0)
                return 70;
        } else if (strcmp(key, "STDIO") == 0) {
            if (parse_stdio(&at, end) != 0)
                return 70;
        } else if (strcmp(key, "HOSTNAME") == 0) {
            if ((uts_hostname = field(&at, end)) == NULL)
                return 70;
        } else if (strcmp(key, "SECCOMP") == 0) {
            if (parse_seccomp(&at, end) != 0)
                return 70;
        } else {
            return 70;
        }
    }
    log_fd = fds[1];
    environ = cenv; /* the container's environment: execvp searches its PATH */
    return run_monitor(fds[0], cwd, notify, cargv);
}

/* Fork a spare; returns the zygote's end of its socket (and the spare's pid in *spare_pid),
 * or -1. */
static int fork_spare(pid_t *spare_pid) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(pair[0]);
        close(pair[1]);
        return -1;
    }
    if (pid == 0) { /* keep only the spare's socket (as fd 3) and stdio */
        if (dup2(pair[1], 3) < 0)
            _exit(70);
        if (syscall(SYS_close_range, 4U, ~0U, 0U) != 0) { /* kernels before 5.9 */
            long top = sysconf(_SC_OPEN_MAX); /* not 1024: the runtime holds more than that */
            for (long fd = 4; fd < (top > 0 ? top : 1L << 20); fd++)
                close((int)fd);
        }
        signal(SIGCHLD, SIG_DFL);
        _exit(spare_main(3));
    }
    close(pair[1]);
    *spare_pid = pid;
    return pair[0];
}

/* "spare PID TICKS" + the spare's socket: the runtime journals (PID, TICKS) as a start's
 * intent before it sends the spare a container (engine.py _settle finds it after a crash). */
static int send_spare(int sock, int spare, pid_t pid) {
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof cbuf);
    char words[64];
    int len = snprintf(words, sizeof words, "spare %d %llu", (int)pid, start_ticks(pid));
    struct iovec iov = {words, (size_t)len};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &spare, sizeof(int));
    ssize_t n;
    do {
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -1 : 0;
}

/* The zygote's loop (the protocol of zygote.py's serve): keep SPARES spares handed to the
 * runtime over SOCK (SOCK_SEQPACKET): "spare" + fd out; "used" (one was taken) and "need"
 * (fork one now) in. A spare is forked after REFILL_IDLE_MS without a message, or at once on
 * "need". Exits when the runtime closes its end. */
static int zygote_main(int sock) {
    prctl(PR_SET_NAME, "pv-zygote");
    signal(SIGCHLD, SIG_IGN); /* finished monitors are reaped by the kernel */
    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    int held = 0, urgent = 0;
    for (;;) {
        int fork_now = urgent;
        if (!fork_now && held < SPARES) {
            struct pollfd p = {sock, POLLIN, 0};
            int n = poll(&p, 1, REFILL_IDLE_MS);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return 0;
            fork_now = n == 0;
        }
        if (fork_now) {
            pid_t spare_pid = 0;
            int spare = fork_spare(&spare_pid);
            if (spare < 0)
                return 71;
            int sent = send_spare(sock, spare, spare_pid);
            close(spare); /* the runtime holds the only other end now */
            if (sent < 0)
                return 0; /* the runtime is gone */
            held++;
            urgent = 0;
            continue;
        }
        char msg[64];
        ssize_t n = recv(sock, msg, sizeof msg, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        if (n == 4 && memcmp(msg, "used", 4) == 0)
            held = held > 0 ? held - 1 : 0;
        else if (n == 4 && memcmp(msg, "need", 4) == 0)
            urgent = 1;
    }
}

/* pv-monitor --seccomp-exec FILE -- CMD...: run CMD under a container's seccomp filter (FILE:
 * the SECCOMP fields, engine.py _seccomp_loader), for ExecSync and Exec, as runc applies a
 * container's filter to its exec'd processes. Errors to stderr, exit 127. */
static int seccomp_exec(const char *file, char **cmd) {
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size > (off_t)MAX_REQUEST) {
        fprintf(stderr, "seccomp-exec: %s: %s\n", file, strerror(errno));
        return 127;
    }
    char *body = malloc((size_t)st.st_size);
    if (body == NULL || read_exact(fd, body, (size_t)st.st_size) != 0) {
        fprintf(stderr, "seccomp-exec: reading %s failed\n", file);
        return 127;
    }
    close(fd);
    char *at = body, *end = body + st.st_size, what[300];
    const char *key = field(&at, end);
    if (key == NULL || strcmp(key, "SECCOMP") != 0 || parse_seccomp(&at, end) != 0) {
        fprintf(stderr, "seccomp-exec: %s is not a seccomp filter\n", file);
        return 127;
    }
    if (build_seccomp(what, sizeof what) != 0 || load_seccomp() != 0) {
        fprintf(stderr, "seccomp-exec: seccomp: %s\n", strerror(errno));
        return 127;
    }
    execvp(cmd[0], cmd);
    fprintf(stderr, "seccomp-exec: exec \"%s\": %s\n", cmd[0], strerror(errno));
    return 127;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "--seccomp-exec") == 0 && strcmp(argv[3], "--") == 0)
        return seccomp_exec(argv[2], argv + 4);
    if (argc != 3 || strcmp(argv[1], "--zygote") != 0) {
        fprintf(stderr, "usage: pv-monitor --zygote FD | --seccomp-exec FILE -- CMD...\n");
        return 2;
    }
    hold_fifo = getenv("PODVISOR_MONITOR_HOLD");
    return zygote_main(atoi(argv[2]));
}
