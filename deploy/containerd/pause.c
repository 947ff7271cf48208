/* pause: the sandbox process for podvisor's private containerd instance.
 *
 * Sleeps until SIGTERM or SIGINT, then exits 0. As PID 1 of a PID namespace it also reaps any
 * zombie re-parented to it. Built static by setup.sh (gcc -static -O2), so the image needs no libc.
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>

static volatile sig_atomic_t stopping = 0;

static void on_stop(int sig) {
    (void)sig;
    stopping = 1;
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop_action = {0};
    struct sigaction child_action = {0};
    sigset_t blocked;
    sigset_t waiting;

    stop_action.sa_handler = on_stop;
    sigaction(SIGTERM, &stop_action, NULL);
    sigaction(SIGINT, &stop_action, NULL);
    child_action.sa_handler = on_child;
    child_action.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &child_action, NULL);

    /* Block the signals, then wait with them unblocked: no lost wake-up between test and wait. */
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGCHLD);
    sigprocmask(SIG_BLOCK, &blocked, &waiting);
    sigdelset(&waiting, SIGTERM);
    sigdelset(&waiting, SIGINT);
    sigdelset(&waiting, SIGCHLD);
    while (!stopping) {
        sigsuspend(&waiting);
    }
    return 0;
}
