/* The shim's epoll fast path (crates/preload/src/epoll.rs), under `flowstack run`.
 *
 * usage: epoll PORT            semantics; prints "ok" and exits 0, else "FAIL ..." and 1
 *        epoll PORT killwait   connects, prints "waiting", sleeps in epoll_wait(-1) until
 *                              the daemon is killed; prints "woke EVENTS" (the socket must
 *                              report EPOLLERR|EPOLLHUP)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int step;
#define CHECK(c, ...)                                                                  \
    do {                                                                               \
        step++;                                                                        \
        if (!(c)) {                                                                    \
            printf("FAIL step %d line %d: ", step, __LINE__);                          \
            printf(__VA_ARGS__);                                                       \
            printf(" (errno %d)\n", errno);                                            \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A connected pair through flowstack: *c is the client side, *s the accepted one. */
static void pair(int port, int *c, int *s) {
    static int l = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l < 0) {
        l = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0, "bind");
        CHECK(listen(l, 16) == 0, "listen");
    }
    *c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(*c, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    *s = accept(l, NULL, NULL);
    CHECK(*s >= 0, "accept");
    fcntl(*s, F_SETFL, O_NONBLOCK);
}

static int wait1(int ep, struct epoll_event *ev, int ms) {
    int n;
    do
        n = epoll_wait(ep, ev, 8, ms);
    while (n < 0 && errno == EINTR);
    return n;
}

static void drain(int s) {
    char b[256];
    while (recv(s, b, sizeof b, MSG_DONTWAIT) > 0) {
    }
}

struct waiter {
    int ep, n;
    struct epoll_event ev[8];
};

static void *sleeper(void *p) {
    struct waiter *w = p;
    w->n = wait1(w->ep, w->ev, 10000);
    return NULL;
}

static int killwait(int port) {
    int c, s;
    pair(port, &c, &s);
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = 7};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e) == 0, "add");
    printf("waiting\n");
    fflush(stdout);
    struct epoll_event ev[8];
    int n = epoll_wait(ep, ev, 8, -1);
    CHECK(n == 1 && ev[0].data.u64 == 7, "one event for the socket, got %d", n);
    printf("woke %s%s\n", ev[0].events & EPOLLERR ? "ERR " : "",
           ev[0].events & EPOLLHUP ? "HUP" : "");
    return 0;
}

int main(int argc, char **argv) {
    int port = atoi(argv[1]);
    if (argc > 2 && !strcmp(argv[2], "killwait"))
        return killwait(port);
    int c, s;
    pair(port, &c, &s);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 42}, ev[8];

    /* Level-triggered. */
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e) == 0, "add");
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e) < 0 && errno == EEXIST, "second add: EEXIST");
    CHECK(wait1(ep, ev, 0) == 0, "nothing ready yet");
    CHECK(send(c, "a", 1, 0) == 1, "send");
    CHECK(wait1(ep, ev, 5000) == 1 && ev[0].data.u64 == 42 && (ev[0].events & EPOLLIN),
          "LT readable");
    CHECK(wait1(ep, ev, 0) == 1, "LT: still readable while unread");
    drain(s);
    CHECK(wait1(ep, ev, 0) == 0, "LT: not readable once read");

    /* Raw system calls through syscall(3) take the same path. */
    int epr = epoll_create1(0);
    struct epoll_event er = {.events = EPOLLIN, .data.u64 = 5};
    CHECK(syscall(SYS_epoll_ctl, epr, EPOLL_CTL_ADD, s, &er) == 0, "raw epoll_ctl");
    send(c, "r", 1, 0);
    CHECK(syscall(SYS_epoll_pwait, epr, ev, 8, 5000, NULL, 8) == 1 && ev[0].data.u64 == 5,
          "raw epoll_pwait");
    drain(s);
    CHECK(syscall(SYS_epoll_pwait, epr, ev, 8, 0, NULL, 8) == 0, "raw: nothing after read");
    close(epr);

    /* Edge-triggered: one report per arrival. */
    e.events = EPOLLIN | EPOLLET;
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e) == 0, "mod ET");
    send(c, "b", 1, 0);
    CHECK(wait1(ep, ev, 5000) == 1, "ET: first edge");
    CHECK(wait1(ep, ev, 50) == 0, "ET: no second report without new data");
    send(c, "c", 1, 0);
    CHECK(wait1(ep, ev, 5000) == 1, "ET: new data is a new edge");
    drain(s);

    /* One-shot: silent after one report until MOD re-arms it. */
    e.events = EPOLLIN | EPOLLONESHOT;
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e) == 0, "mod oneshot");
    send(c, "d", 1, 0);
    CHECK(wait1(ep, ev, 5000) == 1, "oneshot: reported");
    send(c, "e", 1, 0);
    CHECK(wait1(ep, ev, 50) == 0, "oneshot: disabled after the report");
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e) == 0, "re-arm");
    CHECK(wait1(ep, ev, 0) == 1, "oneshot: re-armed and still readable");
    drain(s);
    e.events = EPOLLIN;
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e) == 0, "mod LT");

    /* A kernel pipe and the flowstack socket in one set. */
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    struct epoll_event pe = {.events = EPOLLIN, .data.u64 = 99};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &pe) == 0, "add pipe");
    CHECK(write(p[1], "x", 1) == 1, "write pipe");
    CHECK(wait1(ep, ev, 5000) == 1 && ev[0].data.u64 == 99, "the pipe alone");
    send(c, "f", 1, 0);
    int n = 0, got = 0;
    double t0 = now_ms();
    while (got != 3 && now_ms() - t0 < 5000) {
        n = wait1(ep, ev, 100);
        for (int i = 0; i < n; i++)
            got |= ev[i].data.u64 == 99 ? 1 : ev[i].data.u64 == 42 ? 2 : 4;
    }
    CHECK(got == 3 && n == 2, "pipe and socket both reported (got %d, n %d)", got, n);
    char x;
    CHECK(read(p[0], &x, 1) == 1, "read pipe");
    drain(s);
    CHECK(wait1(ep, ev, 0) == 0, "mixed set quiet again");

    /* poll on the same two descriptors. */
    struct pollfd pf[2] = {{.fd = s, .events = POLLIN}, {.fd = p[0], .events = POLLIN}};
    CHECK(poll(pf, 2, 0) == 0, "poll: nothing");
    send(c, "g", 1, 0);
    CHECK(poll(pf, 2, 5000) == 1 && (pf[0].revents & POLLIN), "poll: the socket");
    write(p[1], "y", 1);
    CHECK(poll(pf, 2, 5000) == 2 && (pf[1].revents & POLLIN), "poll: both");
    read(p[0], &x, 1);
    drain(s);
    CHECK(wait1(ep, ev, 0) == 0, "epoll after poll: quiet");
    send(c, "h", 1, 0);
    CHECK(wait1(ep, ev, 5000) == 1 && ev[0].data.u64 == 42, "epoll after poll: readable");
    drain(s);

    /* A timeout with nothing ready returns 0 after the timeout. */
    t0 = now_ms();
    CHECK(wait1(ep, ev, 200) == 0, "timeout: nothing");
    CHECK(now_ms() - t0 >= 150, "timeout honoured (%.0f ms)", now_ms() - t0);

    /* Another thread asleep in epoll_wait is woken by data. */
    struct waiter w = {.ep = ep};
    pthread_t th;
    pthread_create(&th, NULL, sleeper, &w);
    usleep(100000);
    send(c, "i", 1, 0);
    pthread_join(th, NULL);
    CHECK(w.n == 1 && w.ev[0].data.u64 == 42, "sleeping thread woken (n %d)", w.n);
    drain(s);

    /* EPOLLOUT and EPOLLRDHUP. */
    e.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &e) == 0, "mod out");
    CHECK(wait1(ep, ev, 5000) == 1 && ev[0].events == EPOLLOUT, "writable only (%x)",
          ev[0].events);

    /* EPOLLOUT edge after a full send buffer, once the peer reads. */
    {
        int c6, s6;
        pair(port, &c6, &s6);
        fcntl(c6, F_SETFL, O_NONBLOCK);
        static char big[65536];
        long sent = 0;
        ssize_t k;
        int ep6 = epoll_create1(0);
        struct epoll_event e6 = {.events = EPOLLOUT | EPOLLET, .data.u64 = 66};
        CHECK(epoll_ctl(ep6, EPOLL_CTL_ADD, c6, &e6) == 0, "add c6");
        /* Fill until the socket stays unwritable: the stack takes bytes from the send
         * buffer while the peer's window lasts, each time a new EPOLLOUT edge. */
        int full = 0;
        for (int round = 0; round < 1000 && !full; round++) {
            while ((k = send(c6, big, sizeof big, 0)) > 0 || (k < 0 && errno == EINTR))
                sent += k > 0 ? k : 0;
            CHECK(k < 0 && errno == EAGAIN, "send: EAGAIN when full");
            full = wait1(ep6, ev, 200) == 0;
        }
        CHECK(full && sent > 0, "the send buffer stays full (%ld bytes sent)", sent);
        long got6 = 0;
        int writable = 0;
        double t1 = now_ms();
        while (!writable && now_ms() - t1 < 20000) {
            ssize_t r = recv(s6, big, sizeof big, MSG_DONTWAIT);
            if (r > 0)
                got6 += r;
            n = wait1(ep6, ev, r > 0 ? 0 : 10);
            for (int i = 0; i < n; i++)
                writable |= ev[i].data.u64 == 66 && (ev[i].events & EPOLLOUT);
        }
        CHECK(writable, "EPOLLOUT once the peer read (%ld of %ld bytes)", got6, sent);
        CHECK(send(c6, big, 1, 0) == 1, "send after EPOLLOUT");
        CHECK(epoll_ctl(ep6, EPOLL_CTL_DEL, c6, NULL) == 0, "del c6");
        close(c6);
        close(s6);
        close(ep6);
    }

    /* Nested: a set holding a flowstack socket inside another set, and a socket added to
     * a set that is already nested. */
    int c3, s3, c4, s4;
    pair(port, &c3, &s3);
    pair(port, &c4, &s4);
    int inner = epoll_create1(0), outer = epoll_create1(0);
    struct epoll_event e3 = {.events = EPOLLIN, .data.u64 = 33};
    CHECK(epoll_ctl(inner, EPOLL_CTL_ADD, s3, &e3) == 0, "inner add");
    struct epoll_event eo = {.events = EPOLLIN, .data.u64 = 44};
    CHECK(epoll_ctl(outer, EPOLL_CTL_ADD, inner, &eo) == 0, "outer add");
    send(c3, "m", 1, 0);
    CHECK(wait1(outer, ev, 5000) == 1 && ev[0].data.u64 == 44, "outer wakes for the inner set");
    CHECK(wait1(inner, ev, 0) == 1 && ev[0].data.u64 == 33, "inner reports the socket");
    drain(s3);
    CHECK(wait1(outer, ev, 50) == 0, "nested: quiet once read");
    e3.data.u64 = 34;
    CHECK(epoll_ctl(inner, EPOLL_CTL_ADD, s4, &e3) == 0, "add to a nested set");
    send(c4, "n", 1, 0);
    CHECK(wait1(outer, ev, 5000) == 1 && ev[0].data.u64 == 44, "outer wakes for s4");
    CHECK(wait1(inner, ev, 0) == 1 && ev[0].data.u64 == 34, "inner reports s4");
    drain(s4);

    /* close of a registered socket removes it; a dup keeps the registration. */
    int c2, s2;
    pair(port, &c2, &s2);
    struct epoll_event e2 = {.events = EPOLLIN, .data.u64 = 77};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s2, &e2) == 0, "add s2");
    int d2 = dup(s2);
    close(s2);
    send(c2, "j", 1, 0);
    e.events = EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_MOD, s, &e);
    CHECK(wait1(ep, ev, 5000) == 1 && ev[0].data.u64 == 77, "dup keeps the registration");
    close(d2);
    send(c2, "k", 1, 0);
    CHECK(wait1(ep, ev, 100) == 0, "closed socket removed from the set");
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0, "del");
    send(c, "l", 1, 0);
    CHECK(wait1(ep, ev, 100) == 0, "deleted: not reported");

    /* Peer close: EPOLLIN|EPOLLRDHUP. */
    e.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e) == 0, "re-add");
    drain(s);
    close(c);
    t0 = now_ms();
    n = 0;
    while (now_ms() - t0 < 5000) {
        n = wait1(ep, ev, 100);
        if (n == 1 && (ev[0].events & EPOLLRDHUP))
            break;
    }
    CHECK(n == 1 && (ev[0].events & EPOLLRDHUP) && (ev[0].events & EPOLLIN), "rdhup (%x)",
          ev[0].events);
    /* A set shared across fork, used by the child (its sockets move to the kernel's set).
     * Last: the child adopts every socket of the process (the daemon's holder moves). */
    int c5, s5, sync_[2];
    pair(port, &c5, &s5);
    CHECK(pipe(sync_) == 0, "pipe");
    int epf = epoll_create1(0);
    struct epoll_event e5 = {.events = EPOLLIN, .data.u64 = 55};
    CHECK(epoll_ctl(epf, EPOLL_CTL_ADD, s5, &e5) == 0, "add before fork");
    pid_t pid = fork();
    if (pid == 0) {
        struct epoll_event cev[8];
        int z = wait1(epf, cev, 0);
        write(sync_[1], "r", 1);
        int k = wait1(epf, cev, 5000);
        _exit(z == 0 && k == 1 && cev[0].data.u64 == 55 ? 0 : 1);
    }
    CHECK(read(sync_[0], &x, 1) == 1, "child ready");
    send(c5, "o", 1, 0);
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child saw the event");

    printf("ok\n");
    return 0;
}
