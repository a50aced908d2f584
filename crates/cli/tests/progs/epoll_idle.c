/* epoll_wait's cost with many idle connections (README "Readiness from shared memory").
 *
 * usage: epoll_idle PORT IDLE ROUNDS
 *   opens IDLE+1 connections to itself (a listener on 127.0.0.1:PORT), puts the IDLE+1
 *   accepted ends in one level-triggered epoll set (EPOLLIN), then ROUNDS times writes one
 *   byte on the busy connection's client end and calls epoll_wait until the busy accepted
 *   end is reported, reads the byte. Prints "ROUNDS rounds, N waits, X ns/round" and exits 0;
 *   any other socket reported (the idle ones never are) is a failure ("FAIL ...", exit 1).
 *   Under valgrind --tool=callgrind --toggle-collect=epoll_wait the instructions counted
 *   are those of epoll_wait alone.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...)                                                                      \
    do {                                                                               \
        printf("FAIL: ");                                                              \
        printf(__VA_ARGS__);                                                           \
        printf(" (errno %d)\n", errno);                                                \
        exit(1);                                                                       \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: epoll_idle PORT IDLE ROUNDS\n");
        return 2;
    }
    int port = atoi(argv[1]), idle = atoi(argv[2]), rounds = atoi(argv[3]);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 128))
        FAIL("listen");
    int ep = epoll_create1(0);
    int n = idle + 1, busy_c = -1, busy_s = -1;
    for (int i = 0; i < n; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a))
            FAIL("connect %d", i);
        int s = accept(l, NULL, NULL);
        if (s < 0)
            FAIL("accept %d", i);
        fcntl(s, F_SETFL, O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev))
            FAIL("epoll_ctl");
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* no Nagle wait */
        busy_c = c;
        busy_s = s;
    }
    struct epoll_event evs[64];
    long waits = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < rounds; r++) {
        char b = 'x';
        if (write(busy_c, &b, 1) != 1)
            FAIL("write");
        for (int got = 0; !got;) {
            int k = epoll_wait(ep, evs, 64, 5000);
            waits++;
            if (k <= 0)
                FAIL("epoll_wait %d", k);
            for (int i = 0; i < k; i++) {
                if (evs[i].data.fd != busy_s)
                    FAIL("idle fd %d reported", evs[i].data.fd);
                got = 1;
            }
        }
        if (read(busy_s, &b, 1) != 1)
            FAIL("read");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("%d rounds, %ld waits, %.0f ns/round\n", rounds, waits, rounds ? ns / rounds : 0);
    return 0;
}
