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
 * With TFMAGIC_OWN_PEERS=1 it also keeps other users out: accept() and
 * accept4() close a connection from a loopback address whose socket, in the
 * kernel's socket table (/proc/net/tcp, tcp6), belongs to another user than
 * this process's (root excepted), and go on to the next one, so the server
 * never sees it.  A connection from this machine's own interface address
 * (peer address = local address) is judged the same way; connections from
 * other hosts are not judged here (the address they are allowed on is).  Each refusal is one line on stderr (the
 * first 5, then every 1000th).
 *
 * The environment is read once, when the library is loaded (a later setenv
 * in the process has no effect, and getenv never races with it); bind()
 * itself only copies the address onto the stack.  TFMAGIC_BIND_DEBUG=1
 * prints one line to stderr per rewritten bind.
 *
 * A process that is already running (the notebook kernel, which becomes a
 * TensorFlow server when it connects to a cluster) cannot be preloaded.  For
 * it, tfmagic_guard_loaded(host, match) points the bind() entries of the
 * global offset tables of the loaded objects whose path contains `match`
 * ("/tensorflow/": TensorFlow's own libraries, where gRPC lives) at the same
 * rewrite, and returns how many it changed (0: nothing to change, so the
 * caller must not claim the guard; -1: a bad host).
 * tfmagic_own_peers_loaded(match) does the same for accept() and accept4()
 * with the peer check on, and returns how many entries it changed.  Every other library of
 * the process (the kernel's own ZeroMQ sockets, say) keeps libc's bind.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bind_fn real_bind;
static int enabled;
static int debug;
static struct in_addr want;
static struct in6_addr want_mapped;
static accept_fn real_accept;
static accept4_fn real_accept4;
static int own_peers;
static uid_t me;
static unsigned long refused;

static void init(void) {
    real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    real_accept = (accept_fn)dlsym(RTLD_NEXT, "accept");
    real_accept4 = (accept4_fn)dlsym(RTLD_NEXT, "accept4");
    me = geteuid();
    const char *peers = getenv("TFMAGIC_OWN_PEERS");
    own_peers = peers && strcmp(peers, "1") == 0;
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

static int guarded_bind(int fd, const struct sockaddr *addr, socklen_t len) {
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

int bind(int fd, const struct sockaddr *addr, socklen_t len) { return guarded_bind(fd, addr, len); }

/* -- accept: this user's connections only --------------------------------- */

/* The peer of a connected socket when it is on this machine (a loopback address, or this socket's
 * own address: a process of this host dialling the host's interface address): its port, and ours;
 * 0 when the peer is on another host. */
static int local_peer_ports(int fd, unsigned *peer_port, unsigned *our_port) {
    struct sockaddr_storage peer, local;
    socklen_t plen = sizeof peer, llen = sizeof local;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0) return -1;
    if (getsockname(fd, (struct sockaddr *)&local, &llen) != 0) return -1;
    if (peer.ss_family != local.ss_family) return 0;
    if (peer.ss_family == AF_INET) {
        const struct sockaddr_in *p = (const struct sockaddr_in *)&peer, *l = (const struct sockaddr_in *)&local;
        int here = (ntohl(p->sin_addr.s_addr) >> 24) == 127 || p->sin_addr.s_addr == l->sin_addr.s_addr;
        if (!here) return 0;
        *peer_port = ntohs(p->sin_port);
        *our_port = ntohs(l->sin_port);
    } else if (peer.ss_family == AF_INET6) {
        const struct sockaddr_in6 *p = (const struct sockaddr_in6 *)&peer, *l = (const struct sockaddr_in6 *)&local;
        const unsigned char *b = p->sin6_addr.s6_addr;
        int here = (IN6_IS_ADDR_V4MAPPED(&p->sin6_addr) && b[12] == 127) || IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) ||
                   memcmp(&p->sin6_addr, &l->sin6_addr, sizeof p->sin6_addr) == 0;
        if (!here) return 0;
        *peer_port = ntohs(p->sin6_port);
        *our_port = ntohs(l->sin6_port);
    } else {
        return 0;
    }
    return 1;
}

/* Rows of a socket table whose local port is `peer` and remote port `ours`: how many, and how
 * many belong to another user (not root).  Columns: sl local rem st tx:rx tr:when retr uid ... */
static void scan_table(const char *path, unsigned peer, unsigned ours, int *found, int *foreign, int *read) {
    FILE *f = fopen(path, "re");
    if (!f) return;
    (*read)++;
    char line[512];
    if (!fgets(line, sizeof line, f)) { /* the header */
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        char local[64], remote[64];
        unsigned long uid;
        if (sscanf(line, " %*s %63s %63s %*s %*s %*s %*s %lu", local, remote, &uid) != 3) continue;
        char *lp = strrchr(local, ':'), *rp = strrchr(remote, ':');
        if (!lp || !rp) continue;
        if (strtoul(lp + 1, NULL, 16) != peer || strtoul(rp + 1, NULL, 16) != ours) continue;
        (*found)++;
        if (uid != (unsigned long)me && uid != 0) (*foreign)++;
    }
    fclose(f);
}

/* 1: let the connection in (this user's, root's, or from another host); 0: another user's, or
 * nobody's the table shows (the other end already gone). */
static int admitted(int fd) {
    unsigned peer = 0, ours = 0;
    int where = local_peer_ports(fd, &peer, &ours);
    if (where == 0) return 1;
    if (where < 0) return 0;
    int found = 0, foreign = 0, read = 0;
    scan_table("/proc/net/tcp", peer, ours, &found, &foreign, &read);
    scan_table("/proc/net/tcp6", peer, ours, &found, &foreign, &read);
    if (read == 0) return 1; /* no table to read here: tfmagic did not claim the check (bindguard.py) */
    if (found > 0 && foreign == 0) return 1;
    unsigned long n = __atomic_add_fetch(&refused, 1, __ATOMIC_RELAXED);
    if (n <= 5 || n % 1000 == 0) {
        char text[200];
        int len = snprintf(text, sizeof text,
                           "tfmagic bindhost: refused a connection from this machine's port %u (%s; %lu refused)\n",
                           peer, found ? "another user's process" : "its socket is gone", n);
        if (len > 0) {
            int saved = errno;
            ssize_t ignored = write(2, text, (size_t)len < sizeof text ? (size_t)len : sizeof text - 1);
            (void)ignored;
            errno = saved;
        }
    }
    return 0;
}

/* accept4 with flags, or accept when `plain`: the next connection this user may make. */
static int checked_accept(int fd, struct sockaddr *addr, socklen_t *len, int flags, int plain) {
    pthread_once(&once, init);
    if (plain ? !real_accept : !real_accept4) {
        errno = ENOSYS;
        return -1;
    }
    for (;;) {
        socklen_t room = len ? *len : 0;
        int conn = plain ? real_accept(fd, addr, len) : real_accept4(fd, addr, len, flags);
        if (conn < 0 || !own_peers || admitted(conn)) return conn;
        close(conn); /* then the next one: a non-blocking listener says EAGAIN when there is none */
        if (len) *len = room;
    }
}

static int guarded_accept(int fd, struct sockaddr *addr, socklen_t *len) {
    return checked_accept(fd, addr, len, 0, 1);
}

static int guarded_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    return checked_accept(fd, addr, len, flags, 0);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) { return guarded_accept(fd, addr, len); }

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    return guarded_accept4(fd, addr, len, flags);
}

/* -- connect: a peer that goes silent is given up in seconds ------------- */

static connect_fn real_connect;
static unsigned dead_peer_ms;

/* TCP's own limit on a peer that stops answering (a machine that lost power, a link cut): about
 * 15 minutes of retransmissions when data is unacknowledged, never when the connection just waits
 * for an answer.  Before each TCP connect, ask the kernel to give up after dead_peer_ms without an
 * acknowledgement (TCP_USER_TIMEOUT) and to probe an idle connection (keepalive), so gRPC sees the
 * connection fail and the call waiting on it returns an error.  A peer whose machine is up (a
 * process that is stopped, or busy for an hour) answers both, and keeps its connection, unless it
 * stays stopped while its receive buffer is full (Linux counts a closed window against the timeout). */
static int watched_connect(int fd, const struct sockaddr *addr, socklen_t len) {
    if (!real_connect) {
        errno = ENOSYS;
        return -1;
    }
    unsigned ms = __atomic_load_n(&dead_peer_ms, __ATOMIC_RELAXED);
    if (ms && addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) {
        int type = 0;
        socklen_t tlen = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM) {
            int saved = errno;
            int on = 1, idle = ms / 3000 ? (int)(ms / 3000) : 1, interval = ms / 6000 ? (int)(ms / 6000) : 1,
                count = 4;
            setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
            setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
            setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
            errno = saved;
        }
    }
    return real_connect(fd, addr, len);
}

/* -- the running process: rewrite the GOT entries of bind ----------------- */

struct patch_job {
    const char *match;
    const char *symbol; /* the entries to point at `to` */
    void *to;
    int changed;
};

/* glibc stores most dynamic-section pointers already relocated; others
 * (and some loaders) keep them relative to the object's base. */
static ElfW(Addr) absolute(ElfW(Addr) value, ElfW(Addr) base) { return value < base ? value + base : value; }

static int is_bind_slot(unsigned long type) {
#if defined(__x86_64__)
    return type == R_X86_64_JUMP_SLOT || type == R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
    return type == R_AARCH64_JUMP_SLOT || type == R_AARCH64_GLOB_DAT;
#else
    (void)type;
    return 0;
#endif
}

static int write_slot(void **slot, void *value) {
    long page = sysconf(_SC_PAGESIZE);
    void *start = (void *)((ElfW(Addr))slot & ~(ElfW(Addr))(page - 1));
    if (mprotect(start, (size_t)page, PROT_READ | PROT_WRITE) != 0) return -1;
    __atomic_store_n(slot, value, __ATOMIC_SEQ_CST);
    return 0;
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct patch_job *job = data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, job->match)) return 0;
    ElfW(Addr) base = info->dlpi_addr;
    const ElfW(Dyn) *dyn = NULL;
    ElfW(Addr) relro_start = 0, relro_end = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            relro_start = base + ph->p_vaddr;
            relro_end = relro_start + ph->p_memsz;
        }
    }
    if (!dyn) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *tables[2] = {NULL, NULL};
    size_t sizes[2] = {0, 0};
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)absolute(d->d_un.d_ptr, base); break;
        case DT_STRTAB: strtab = (const char *)absolute(d->d_un.d_ptr, base); break;
        case DT_JMPREL: tables[0] = (const ElfW(Rela) *)absolute(d->d_un.d_ptr, base); break;
        case DT_PLTRELSZ: sizes[0] = d->d_un.d_val; break;
        case DT_RELA: tables[1] = (const ElfW(Rela) *)absolute(d->d_un.d_ptr, base); break;
        case DT_RELASZ: sizes[1] = d->d_un.d_val; break;
        default: break;
        }
    }
    if (!symtab || !strtab) return 0;
    for (int t = 0; t < 2; t++) {
        if (!tables[t]) continue;
        size_t n = sizes[t] / sizeof(ElfW(Rela));
        for (size_t i = 0; i < n; i++) {
            const ElfW(Rela) *r = &tables[t][i];
            if (!is_bind_slot(ELF64_R_TYPE(r->r_info))) continue;
            const ElfW(Sym) *sym = &symtab[ELF64_R_SYM(r->r_info)];
            if (strcmp(strtab + sym->st_name, job->symbol) != 0) continue;
            void **slot = (void **)(base + r->r_offset);
            if (*slot == job->to) {
                job->changed++;
                continue;
            }
            if (write_slot(slot, job->to) != 0) continue;
            if ((ElfW(Addr))slot >= relro_start && (ElfW(Addr))slot < relro_end) {
                long page = sysconf(_SC_PAGESIZE);
                mprotect((void *)((ElfW(Addr))slot & ~(ElfW(Addr))(page - 1)), (size_t)page, PROT_READ);
            }
            job->changed++;
        }
    }
    return 0;
}

/* Point every entry for `symbol` in the loaded objects whose path contains `match` at `to`;
 * returns how many point there now (servethreads.c uses it too). */
__attribute__((visibility("hidden"))) int tfmagic_patch_got(const char *match, const char *symbol, void *to) {
    struct patch_job job = {match, symbol, to, 0};
    dl_iterate_phdr(patch_object, &job);
    return job.changed;
}

int tfmagic_guard_loaded(const char *host, const char *match) {
    pthread_once(&once, init);
    struct in_addr address;
    if (!host || !match || inet_pton(AF_INET, host, &address) != 1) return -1;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_DEFAULT, "bind");
    if (!real_bind || real_bind == guarded_bind) return 0;
    want = address;
    memset(&want_mapped, 0, sizeof want_mapped);
    want_mapped.s6_addr[10] = 0xff;
    want_mapped.s6_addr[11] = 0xff;
    memcpy(&want_mapped.s6_addr[12], &want, 4);
    __atomic_store_n(&enabled, 1, __ATOMIC_SEQ_CST);
    return tfmagic_patch_got(match, "bind", (void *)guarded_bind);
}

int tfmagic_own_peers_loaded(const char *match) {
    pthread_once(&once, init);
    if (!match) return -1;
    if (!real_accept) real_accept = (accept_fn)dlsym(RTLD_DEFAULT, "accept");
    if (!real_accept4) real_accept4 = (accept4_fn)dlsym(RTLD_DEFAULT, "accept4");
    if (real_accept == guarded_accept || real_accept4 == guarded_accept4) return 0;
    if (!real_accept || !real_accept4) return 0;
    __atomic_store_n(&own_peers, 1, __ATOMIC_SEQ_CST);
    int changed = 0;
    const char *symbols[2] = {"accept", "accept4"};
    void *to[2] = {(void *)guarded_accept, (void *)guarded_accept4};
    for (int i = 0; i < 2; i++) changed += tfmagic_patch_got(match, symbols[i], to[i]);
    return changed;
}

/* The TCP connections the libraries under `match` open from now on give up on a silent peer after
 * `ms` milliseconds (watched_connect; 0: TCP's own 15 minutes again).  Returns how many connect()
 * entries point at the wrapper. */
int tfmagic_dead_peer_loaded(const char *match, unsigned ms) {
    pthread_once(&once, init);
    if (!match) return -1;
    if (!real_connect) real_connect = (connect_fn)dlsym(RTLD_DEFAULT, "connect");
    if (!real_connect || real_connect == watched_connect) return 0;
    __atomic_store_n(&dead_peer_ms, ms, __ATOMIC_SEQ_CST);
    return tfmagic_patch_got(match, "connect", (void *)watched_connect);
}
