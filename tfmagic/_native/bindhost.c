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
 *
 * A process that is already running (the notebook kernel, which becomes a
 * TensorFlow server when it connects to a cluster) cannot be preloaded.  For
 * it, tfmagic_guard_loaded(host, match) points the bind() entries of the
 * global offset tables of the loaded objects whose path contains `match`
 * ("/tensorflow/": TensorFlow's own libraries, where gRPC lives) at the same
 * rewrite, and returns how many it changed (0: nothing to change, so the
 * caller must not claim the guard; -1: a bad host).  Every other library of
 * the process (the kernel's own ZeroMQ sockets, say) keeps libc's bind.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* -- the running process: rewrite the GOT entries of bind ----------------- */

struct patch_job {
    const char *match;
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
            if (strcmp(strtab + sym->st_name, "bind") != 0) continue;
            void **slot = (void **)(base + r->r_offset);
            if (*slot == (void *)guarded_bind) {
                job->changed++;
                continue;
            }
            if (write_slot(slot, (void *)guarded_bind) != 0) continue;
            if ((ElfW(Addr))slot >= relro_start && (ElfW(Addr))slot < relro_end) {
                long page = sysconf(_SC_PAGESIZE);
                mprotect((void *)((ElfW(Addr))slot & ~(ElfW(Addr))(page - 1)), (size_t)page, PROT_READ);
            }
            job->changed++;
        }
    }
    return 0;
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
    struct patch_job job = {match, 0};
    dl_iterate_phdr(patch_object, &job);
    return job.changed;
}
