/* Keep TensorFlow's gRPC servers off the network: rewrite wildcard binds.
 *
 * TensorFlow's GrpcServer binds "0.0.0.0:<port>" (hard-coded; gRPC makes a
 * dual-stack [::] listener of it) and runs any graph it is sent.  Loaded with
 * LD_PRELOAD into a task process, this library rewrites bind() calls on the
 * wildcard address to the address in TFMAGIC_BIND_HOST (an IPv4 literal):
 * AF_INET 0.0.0.0 -> that address, AF_INET6 :: -> its IPv4-mapped form
 * (::ffff:a.b.c.d).  Every other bind passes through unchanged.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind = NULL;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *host = getenv("TFMAGIC_BIND_HOST");
    struct in_addr want;
    if (!host || !addr || inet_pton(AF_INET, host, &want) != 1) return real_bind(fd, addr, len);
    int debug = getenv("TFMAGIC_BIND_DEBUG") && getenv("TFMAGIC_BIND_DEBUG")[0] == '1';
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in copy;
        memcpy(&copy, addr, sizeof copy);
        if (copy.sin_addr.s_addr == htonl(INADDR_ANY)) {
            copy.sin_addr = want;
            if (debug) fprintf(stderr, "tfmagic bindhost: 0.0.0.0:%d -> %s\n", ntohs(copy.sin_port), host);
            return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 copy;
        memcpy(&copy, addr, sizeof copy);
        if (memcmp(&copy.sin6_addr, &in6addr_any, sizeof(struct in6_addr)) == 0) {
            memset(&copy.sin6_addr, 0, sizeof(struct in6_addr));
            copy.sin6_addr.s6_addr[10] = 0xff;
            copy.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&copy.sin6_addr.s6_addr[12], &want, 4);
            if (debug) fprintf(stderr, "tfmagic bindhost: [::]:%d -> [::ffff:%s]\n", ntohs(copy.sin6_port), host);
            return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
        }
    }
    return real_bind(fd, addr, len);
}
