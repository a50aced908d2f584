/* Signals and blocking socket calls under the shim (crates/cli/tests/apps.rs).
 *
 * usage: signals PORT
 * 1. recv blocked, SIGUSR1 (handler with SA_RESTART) arrives: the handler runs and recv
 *    goes on waiting, then returns the byte sent afterwards (restart per signal).
 * 2. recv blocked, SIGUSR2 (handler without SA_RESTART) arrives: recv fails with EINTR.
 * 3. sigaction(SIGUSR1, NULL, &old) shows the application's own handler; signal() returns
 *    the previous one.
 * 4. A SIGUSR1 handler that itself sends on a flowstack socket, fired 2000 times while the
 *    main thread sends and receives: every byte arrives (a handler never runs in the middle
 *    of the shim's own work).
 * Prints "ok" and exits 0, or names the failed step and exits with its number. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t got1, got2, phase;
static int cfd = -1, sfd = -1;
static pid_t main_tid;
static volatile long handler_sent;

static void fail(int step, const char *what) {
    printf("step %d: %s (errno %d)\n", step, what, errno);
    fflush(stdout);
    _exit(step);
}

static void h1(int s) {
    (void)s;
    got1++;
    if (phase == 4) {
        int e = errno;
        if (send(cfd, "h", 1, MSG_NOSIGNAL) == 1)
            handler_sent++;
        errno = e;
    }
}
static void h2(int s) { (void)s; got2++; }

/* Waits (bounded) until the main thread sleeps in poll/ppoll: the shim's blocking wait. */
static void wait_blocked(void) {
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", main_tid);
    for (int i = 0; i < 20000; i++) {
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            long nr = strtol(buf, NULL, 10);
            if (nr == SYS_poll || nr == SYS_ppoll)
                return;
        }
        usleep(500);
    }
    fail(90, "main thread never blocked");
}

static void *helper(void *arg) {
    (void)arg;
    pid_t pid = getpid();
    wait_blocked();
    syscall(SYS_tgkill, pid, main_tid, SIGUSR1);
    for (int i = 0; i < 20000 && !got1; i++)
        usleep(500);
    if (send(cfd, "a", 1, 0) != 1)
        fail(91, "helper send");
    while (phase != 2)
        usleep(200);
    wait_blocked();
    syscall(SYS_tgkill, pid, main_tid, SIGUSR2);
    while (phase != 4)
        usleep(200);
    for (int i = 0; i < 2000; i++) {
        syscall(SYS_tgkill, pid, main_tid, SIGUSR1);
        usleep(50);
    }
    phase = 5;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2)
        fail(99, "usage: signals PORT");
    main_tid = gettid();
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = h1;
    a.sa_flags = SA_RESTART;
    sigemptyset(&a.sa_mask);
    if (sigaction(SIGUSR1, &a, NULL))
        fail(98, "sigaction SIGUSR1");
    a.sa_handler = h2;
    a.sa_flags = 0;
    if (sigaction(SIGUSR2, &a, NULL))
        fail(98, "sigaction SIGUSR2");

    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 4))
        fail(97, "bind/listen");
    cfd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cfd, (struct sockaddr *)&sa, sizeof sa))
        fail(97, "connect");
    sfd = accept(lfd, NULL, NULL);
    if (sfd < 0)
        fail(97, "accept");
    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    pthread_t t;
    pthread_create(&t, NULL, helper, NULL);
    char c;
    /* 1 */
    ssize_t n = recv(sfd, &c, 1, 0);
    if (n != 1 || c != 'a' || got1 != 1)
        fail(1, "recv did not restart after an SA_RESTART handler");
    /* 2 */
    phase = 2;
    n = recv(sfd, &c, 1, 0);
    if (n != -1 || errno != EINTR || got2 != 1)
        fail(2, "recv was not interrupted by a handler without SA_RESTART");
    /* 3 */
    struct sigaction old;
    if (sigaction(SIGUSR1, NULL, &old) || old.sa_handler != h1 ||
        !(old.sa_flags & SA_RESTART) || (old.sa_flags & SA_SIGINFO))
        fail(3, "sigaction does not show the application's handler");
    if (signal(SIGUSR2, SIG_IGN) != h2)
        fail(3, "signal does not return the previous handler");
    /* 4 */
    long sent = 0, rcvd = 0;
    char buf[4096];
    phase = 4;
    time_t end = 0;
    while (phase != 5 || rcvd < sent + handler_sent) {
        if (phase == 5) {
            if (!end)
                end = time(NULL) + 10;
            else if (time(NULL) > end)
                fail(4, "bytes sent by handlers never arrived");
        }
        if (phase != 5) {
            ssize_t k = send(cfd, "m", 1, MSG_NOSIGNAL);
            if (k == 1)
                sent++;
            else if (errno != EINTR)
                fail(4, "send");
        }
        ssize_t k = recv(sfd, buf, sizeof buf, MSG_DONTWAIT);
        if (k > 0)
            rcvd += k;
        else if (k < 0 && errno != EAGAIN && errno != EINTR)
            fail(4, "recv");
    }
    pthread_join(t, NULL);
    if (rcvd != sent + handler_sent || handler_sent == 0)
        fail(4, "bytes sent by handlers were lost or misplaced");
    printf("ok %ld %ld %ld\n", sent, (long)handler_sent, rcvd);
    return 0;
}
