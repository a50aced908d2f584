/* Descriptor flags and numbers of flowstack sockets (crates/cli/tests/apps_epoll.rs):
 * socket(2)'s SOCK_CLOEXEC/SOCK_NONBLOCK and accept4(2)'s flags are those asked for (the
 * shim makes the placeholder with them), O_NONBLOCK is shared with a dup, and a socket gets
 * the lowest free number, as the kernel would give. Usage: fdflags PORT. Prints "ok". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(c)                                                              \
    do {                                                                      \
        if (!(c)) {                                                           \
            printf("FAIL line %d: %s (errno %d)\n", __LINE__, #c, errno);     \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

static int cloexec(int fd) { return (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }
static int nonblock(int fd) { return (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

int main(int argc, char **argv) {
    CHECK(argc == 2);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0 && !cloexec(l) && !nonblock(l));
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK(bind(l, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(listen(l, 16) == 0);

    /* The lowest free number, as the kernel gives (the first socket above registered). */
    int n = open("/dev/null", O_RDONLY);
    CHECK(n >= 0 && close(n) == 0);
    int c1 = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHECK(c1 == n);
    CHECK(cloexec(c1) && nonblock(c1));
    /* And again: no piece of the last placeholder pair is left below the next number. */
    n = open("/dev/null", O_RDONLY);
    CHECK(n >= 0 && close(n) == 0);
    int c0 = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c0 == n);
    CHECK(close(c0) == 0);
    CHECK(connect(c1, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EINPROGRESS);

    int a1 = accept4(l, NULL, NULL, SOCK_NONBLOCK);
    CHECK(a1 >= 0 && !cloexec(a1) && nonblock(a1));
    int d = dup(a1); /* O_NONBLOCK belongs to the open file description */
    CHECK(d >= 0 && fcntl(d, F_SETFL, 0) == 0 && !nonblock(a1));
    CHECK(close(d) == 0);

    int c2 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(c2 >= 0 && cloexec(c2) && !nonblock(c2));
    CHECK(connect(c2, (struct sockaddr *)&sa, sizeof sa) == 0);
    int a2 = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    CHECK(a2 >= 0 && cloexec(a2) && !nonblock(a2));
    int a3 = -1;
    int c3 = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(c3 >= 0 && connect(c3, (struct sockaddr *)&sa, sizeof sa) == 0);
    a3 = accept(l, NULL, NULL);
    CHECK(a3 >= 0 && !cloexec(a3) && !nonblock(a3));

    /* Still sockets: a blocking round trip on the accepted, flag-less ones. */
    char buf[8];
    CHECK(write(a2, "ping", 4) == 4);
    CHECK(read(c2, buf, sizeof buf) == 4 && memcmp(buf, "ping", 4) == 0);
    CHECK(write(c3, "pong", 4) == 4);
    CHECK(read(a3, buf, sizeof buf) == 4 && memcmp(buf, "pong", 4) == 0);
    printf("numbers l=%d c1=%d a1=%d c2=%d a2=%d c3=%d a3=%d\n", l, c1, a1, c2, a2, c3, a3);
    printf("ok\n");
    return 0;
}
