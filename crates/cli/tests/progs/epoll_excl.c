/* EPOLLEXCLUSIVE on flowstack sockets (crates/preload/src/epoll.rs), under `flowstack run`.
 *
 * usage: epoll_excl PORT WORKERS CONNS [plain]
 *   1. epoll_ctl's rules (epoll_ctl(2)): EPOLLEXCLUSIVE only with EPOLL_CTL_ADD; EINVAL with
 *      EPOLL_CTL_MOD, with EPOLLONESHOT or EPOLLRDHUP, on an epoll descriptor, and for MOD of
 *      a descriptor added with it — on a flowstack connection and on a flowstack listener.
 *   2. nginx's accept herd: WORKERS processes (fork) each put the same non-blocking listener
 *      in an epoll set of their own with EPOLLIN|EPOLLEXCLUSIVE and accept what they are
 *      woken for; CONNS connections come one after the other (each answered before the
 *      next). Prints "conns C accepted A wakes W empty E" (W: epoll_waits that returned
 *      something, E: of those, accept found nothing) and "ok"; exits 1 with "FAIL ..." on
 *      a broken rule or a lost connection. The caller compares W with C (the kernel wakes
 *      one process per connection, or a few; without EPOLLEXCLUSIVE every one wakes).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAIL(...)                                                                      \
    do {                                                                               \
        printf("FAIL: ");                                                              \
        printf(__VA_ARGS__);                                                           \
        printf(" (errno %d)\n", errno);                                                \
        fflush(stdout);                                                                \
        exit(1);                                                                       \
    } while (0)

static void expect_einval(int ep, int op, int fd, unsigned events, const char *what) {
    struct epoll_event e = {.events = events, .data.fd = fd};
    errno = 0;
    if (epoll_ctl(ep, op, fd, &e) != -1 || errno != EINVAL)
        FAIL("%s: EINVAL expected", what);
}

static void rules(int ep, int fd, const char *what) {
    char m[128];
    snprintf(m, sizeof m, "%s: ADD EXCLUSIVE|ONESHOT", what);
    expect_einval(ep, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT, m);
    snprintf(m, sizeof m, "%s: ADD EXCLUSIVE|RDHUP", what);
    expect_einval(ep, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLEXCLUSIVE | EPOLLRDHUP, m);
    snprintf(m, sizeof m, "%s: MOD EXCLUSIVE (not in the set)", what);
    expect_einval(ep, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLEXCLUSIVE, m);
    struct epoll_event e = {.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLET, .data.fd = fd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e))
        FAIL("%s: ADD EXCLUSIVE|ET", what);
    snprintf(m, sizeof m, "%s: MOD of an EXCLUSIVE interest", what);
    expect_einval(ep, EPOLL_CTL_MOD, fd, EPOLLIN, m);
    snprintf(m, sizeof m, "%s: MOD EXCLUSIVE", what);
    expect_einval(ep, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLEXCLUSIVE, m);
    if (epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL))
        FAIL("%s: DEL", what);
    e.events = EPOLLIN;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e))
        FAIL("%s: ADD", what);
    snprintf(m, sizeof m, "%s: MOD EXCLUSIVE of a plain interest", what);
    expect_einval(ep, EPOLL_CTL_MOD, fd, EPOLLIN | EPOLLEXCLUSIVE, m);
    if (epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL))
        FAIL("%s: DEL", what);
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: epoll_excl PORT WORKERS CONNS [plain]\n");
        return 2;
    }
    int port = atoi(argv[1]), workers = atoi(argv[2]), conns = atoi(argv[3]);
    unsigned excl = argc == 5 ? 0 : EPOLLEXCLUSIVE;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128))
        FAIL("listen");

    /* 1. The rules, on a connection and on the listener. */
    int ep = epoll_create1(0), inner = epoll_create1(0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a))
        FAIL("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0)
        FAIL("accept");
    rules(ep, s, "connection");
    rules(ep, l, "listener");
    expect_einval(ep, EPOLL_CTL_ADD, inner, EPOLLIN | EPOLLEXCLUSIVE, "epoll fd: ADD EXCLUSIVE");
    close(c);
    close(s);
    close(ep);
    close(inner);

    /* 2. The herd. */
    fcntl(l, F_SETFL, O_NONBLOCK);
    int ready[2], report[2];
    if (pipe(ready) || pipe(report))
        FAIL("pipe");
    for (int w = 0; w < workers; w++) {
        if (fork() == 0) {
            int e = epoll_create1(0);
            struct epoll_event ev = {.events = EPOLLIN | excl, .data.fd = l};
            if (epoll_ctl(e, EPOLL_CTL_ADD, l, &ev))
                FAIL("worker: ADD");
            if (write(ready[1], "r", 1) != 1)
                FAIL("worker: ready");
            long got[3] = {0, 0, 0}; /* accepted, wakes, empty */
            struct epoll_event evs[8];
            int k;
            /* Until 2 s pass with nothing: the connections are over. */
            while ((k = epoll_wait(e, evs, 8, 2000)) != 0) {
                if (k < 0) {
                    if (errno == EINTR)
                        continue;
                    FAIL("worker: epoll_wait");
                }
                got[1]++;
                int took = 0, x;
                while ((x = accept(l, NULL, NULL)) >= 0) {
                    took++;
                    if (write(x, "a", 1) != 1)
                        FAIL("worker: answer");
                    close(x);
                }
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    FAIL("worker: accept");
                got[0] += took;
                got[2] += took == 0;
            }
            if (write(report[1], got, sizeof got) != sizeof got)
                FAIL("worker: report");
            _exit(0);
        }
    }
    for (int w = 0; w < workers; w++) {
        char b;
        if (read(ready[0], &b, 1) != 1)
            FAIL("ready");
    }
    for (int i = 0; i < conns; i++) {
        int x = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(x, (struct sockaddr *)&a, sizeof a))
            FAIL("connect %d", i);
        char b;
        if (read(x, &b, 1) != 1 || b != 'a')
            FAIL("answer %d", i);
        close(x);
    }
    long sum[3] = {0, 0, 0};
    for (int w = 0; w < workers; w++) {
        long got[3];
        if (read(report[0], got, sizeof got) != sizeof got)
            FAIL("report");
        for (int j = 0; j < 3; j++)
            sum[j] += got[j];
    }
    while (wait(NULL) > 0) {
    }
    printf("conns %d accepted %ld wakes %ld empty %ld\n", conns, sum[0], sum[1], sum[2]);
    if (sum[0] != conns)
        FAIL("%ld of %d connections accepted", sum[0], conns);
    printf("ok\n");
    return 0;
}
