/* Keep TensorFlow's gRPC servers off the network: rewrite wildcard binds.
 *
 * TensorFlow's GrpcServer binds "0.0.0.0:<port>" (hard-coded; gRPC makes a
 * dual-stack [::] listener of it) and runs any graph it is sent.  Loaded with
 * LD_PRELOAD into a task process, this library rewrites bind() calls on the
 * wildcard address to the address in TFMAGIC_BIND_HOST (an IPv4 literal):
 *
 *   AF_INET  0.0.0.0:port -> host:port
 *   AF_INET6 [::]:port    -> [::ffff:host]:port (IPv4-mapped)
 *
 * Every other bind passes through unchanged; ports are kept.  IPv4-mapped
 * rather than ::1 because clients that resolve "localhost" to 127.0.0.1 must
 * still reach the server.  IPV6_V6ONLY is left alone: an IPv6-only socket
 * cannot take a mapped address, so its bind fails (EINVAL) instead of
 * listening everywhere, and gRPC falls back to its AF_INET socket.
 *
 * The environment is read once, when the library is loaded (a later setenv
 * in the process has no effect, and getenv never races with it); bind()
 * itself only copies the address onto the stack.  TFMAGIC_BIND_DEBUG=1
 * prints one line to stderr per rewritten bind.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bind_fn real_bind;
static int enabled;
static int debug;
static struct in_addr want;
static struct in6_addr want_mapped;

static void init(void) {
    real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *host = getenv("TFMAGIC_BIND_HOST");
    if (host && inet_pton(AF_INET, host, &want) == 1) {
        memset(&want_mapped, 0, sizeof want_mapped);
        want_mapped.s6_addr[10] = 0xff;
        want_mapped.s6_addr[11] = 0xff;
        memcpy(&want_mapped.s6_addr[12], &want, 4);
        enabled = 1;
    }
    const char *flag = getenv("TFMAGIC_BIND_DEBUG");
    debug = flag && strcmp(flag, "1") == 0;
}

/* Runs at load time, before the program has threads; bind() also calls
 * pthread_once in case another library's constructor binds before this. */
__attribute__((constructor)) static void load(void) { pthread_once(&once, init); }

static void note(int family, int port) {
    char text[INET_ADDRSTRLEN], line[128];
    inet_ntop(AF_INET, &want, text, sizeof text);
    int n = family == AF_INET
                ? snprintf(line, sizeof line, "tfmagic bindhost: 0.0.0.0:%d -> %s:%d\n", port, text, port)
                : snprintf(line, sizeof line, "tfmagic bindhost: [::]:%d -> [::ffff:%s]:%d\n", port, text, port);
    if (n > 0) {
        int saved = errno;
        ssize_t ignored = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
        errno = saved;
    }
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    pthread_once(&once, init);
    if (!real_bind) {
        errno = ENOSYS;
        return -1;
    }
    if (!enabled || !addr) return real_bind(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in copy;
        memcpy(&copy, addr, sizeof copy);
        if (copy.sin_addr.s_addr == htonl(INADDR_ANY)) {
            copy.sin_addr = want;
            if (debug) note(AF_INET, ntohs(copy.sin_port));
            return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 copy;
        memcpy(&copy, addr, sizeof copy);
        if (memcmp(&copy.sin6_addr, &in6addr_any, sizeof copy.sin6_addr) == 0) {
            copy.sin6_addr = want_mapped;
            copy.sin6_scope_id = 0;
            if (debug) note(AF_INET6, ntohs(copy.sin6_port));
            return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
        }
    }
    return real_bind(fd, addr, len);
}
