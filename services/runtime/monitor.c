/*
 * pv-monitor: the per-container monitor of podvisor's embedded runtime, in C (conmon /
 * containerd-shim style). The same contract as services/runtime/monitor.py, which stays the
 * fallback where no C compiler was available at install time:
 *
 *   pv-monitor STATE_DIR REPLY_FD LOG_FD CWD LOG_PATH NOTIFY -- ARGV...  (environ = the container's)
 *
 * It leaves the caller's session, starts ARGV in its own session/process group (PATH searched in
 * the container's environment, stdout/stderr to pipes, stdin /dev/null, default signal
 * dispositions and an empty mask), writes STATE_DIR/started.json, answers once on REPLY_FD
 * ({"ok": true, "monitor_pid", "monitor_ticks", "pid", "pid_ticks", "started_at"} or
 * {"ok": false, "error": "..."}), copies the output into LOG_FD as CRI log records
 * ("<RFC3339Nano> <stdout|stderr> <F|P> <line>", lines over 16 KiB split into P records),
 * reopens LOG_PATH on SIGHUP, and when the process exits: SIGKILLs the rest of its process group,
 * drains the output for at most 2 s, writes STATE_DIR/exit.json
 * ({"exit_code", "finished_at", "reason", "message"}), then sends the same record plus "id" (the
 * state dir's name) as one datagram to the runtime's unix socket NOTIFY (best effort; "" = none)
 * and exits. exit.json is written atomically (tmp + rename); started.json, a new file, with one
 * write. LOG_FD and REPLY_FD may be -1.
 *
 * The runtime starts it by exec from a pre-forked spare monitor (zygote.py / monitor.py), so its
 * pid and start time are the spare's.
 *
 * Why C: a monitor lives as long as its container. A Python monitor forked from a zygote keeps
 * ~1.8 MB of private pages (110 pods: ~200 MB); this one ~0.1 MB, and it starts with one
 * posix_spawn instead of a Python fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINE (16 * 1024)
#define DRAIN_AFTER_EXIT_MS 2000
#define LOG_FLAGS (O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC)

extern char **environ;

static const char *state_dir;
static const char *log_path;
static int log_fd = -1;

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

static void write_file_new(const char *name, const char *data) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", state_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    write_all(fd, data, strlen(data));
    close(fd);
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
    snprintf(path, sizeof path, "%s/%s", state_dir, name);
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

/* Child side of the fork: never returns. Reports (stage, errno) on err_w if exec fails. */
static void exec_container(const char *cwd, char **argv, int out_w, int err_w, int report_w) {
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0 && null != 0) {
        dup2(null, 0);
        close(null);
    }
    dup2(out_w, 1);
    dup2(err_w, 2);
    setsid();
    sigset_t none;
    sigemptyset(&none);
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int report[2];
    if (chdir(cwd) != 0) {
        report[0] = 1;
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
    pid_t pid = fork();
    if (pid < 0) {
        reply_error(reply_fd, "fork: %s (errno %d)", strerror(errno), errno);
        return -1;
    }
    if (pid == 0) {
        close(out[0]);
        close(err[0]);
        close(rep[0]);
        exec_container(cwd, argv, out[1], err[1], rep[1]);
    }
    close(out[1]);
    close(err[1]);
    close(rep[1]);
    int report[2];
    ssize_t n;
    do {
        n = read(rep[0], report, sizeof report);
    } while (n < 0 && errno == EINTR);
    close(rep[0]);
    if (n == (ssize_t)sizeof report) { /* exec failed: the child reported before exiting */
        waitpid(pid, NULL, 0);
        close(out[0]);
        close(err[0]);
        if (report[0] == 1) {
            reply_error(reply_fd, "chdir '%s': %s (errno %d)", cwd, strerror(report[1]),
                        report[1]);
        } else {
            reply_error(reply_fd, "exec \"%s\": %s (errno %d %s)", argv[0],
                        strerror(report[1]), report[1], errno_name(report[1]));
        }
        return -1;
    }
    *out_r = out[0];
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
    while (open_streams > 0 || !exited) {
        struct pollfd fds[4] = {
            {out.fd, POLLIN, 0}, {err.fd, POLLIN, 0}, {pidfd, POLLIN, 0}, {sigfd, POLLIN, 0}};
        int timeout = -1;
        if (exited) {
            long long left = (deadline - now_ns(CLOCK_MONOTONIC)) / 1000000;
            if (left <= 0)
                break;
            timeout = (int)left;
        } else if (pidfd < 0) {
            timeout = 100; /* no pidfd (old kernel): poll waitpid */
        }
        int n = poll(fds, 4, timeout);
        if (n < 0 && errno != EINTR)
            break;
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
            } else if (got == 0 || errno != EINTR) {
                feed(s, "", 0, 1);
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

int main(int argc, char **argv) {
    if (argc < 9 || strcmp(argv[7], "--") != 0) {
        fprintf(stderr,
                "usage: pv-monitor STATE_DIR REPLY_FD LOG_FD CWD LOG_PATH NOTIFY -- ARGV...\n");
        return 2;
    }
    state_dir = argv[1];
    int reply_fd = atoi(argv[2]);
    log_fd = atoi(argv[3]);
    const char *cwd = argv[4];
    log_path = argv[5];
    const char *notify = argv[6];
    char **cargv = argv + 8;

    prctl(PR_SET_NAME, "pv-monitor"); /* what ps -o comm / top show */
    setsid();
    char errpath[4096];
    snprintf(errpath, sizeof errpath, "%s/monitor.err", state_dir);
    int errfd = open(errpath, LOG_FLAGS, 0600);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
    }
    if (errfd >= 0)
        dup2(errfd, 2);
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
    char started[512];
    snprintf(started, sizeof started,
             "{\"monitor_pid\": %d, \"monitor_ticks\": %llu, \"pid\": %d, \"pid_ticks\": %llu, "
             "\"started_at\": %lld}",
             (int)getpid(), start_ticks(getpid()), (int)pid, start_ticks(pid),
             now_ns(CLOCK_REALTIME));
    /* Durable before the caller hears "started" (see monitor.py); a new file written by one
     * write needs no tmp + rename. */
    write_file_new("started.json", started);
    if (reply_fd >= 0) {
        char reply[600];
        int n = snprintf(reply, sizeof reply, "{\"ok\": true, %s", started + 1);
        write_all(reply_fd, reply, (size_t)n);
        close(reply_fd);
    }
    int code = 255;
    long long finished = now_ns(CLOCK_REALTIME);
    pump(pid, out_r, err_r, &code, &finished);
    char exitrec[256];
    snprintf(exitrec, sizeof exitrec,
             "{\"exit_code\": %d, \"finished_at\": %lld, \"reason\": \"%s\", \"message\": \"\"}",
             code, finished, code == 0 ? "Completed" : "Error");
    /* Output drained first, exit.json next (the durable record), then the note. */
    write_file_atomic("exit.json", exitrec);
    const char *slash = strrchr(state_dir, '/');
    char id[512], note[1024];
    json_escape(id, sizeof id, slash ? slash + 1 : state_dir);
    snprintf(note, sizeof note, "{\"id\": \"%s\", %s", id, exitrec + 1);
    send_note(notify, note);
    return 0;
}
