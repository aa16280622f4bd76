/* How many threads serve a TensorFlow server's worker service (and so how much memory it holds).
 *
 * Every tf.distribute.Server starts TensorFlow's gRPC worker service with GrpcWorkerServiceOptions'
 * defaults: 8 serving threads, each with its own completion queue on which it posts, before any
 * call arrives, about 1,750 requests (1,000 RecvTensor, 500 RecvBuf, 100 RunGraph, 100 CleanupGraph
 * ...; grpc_worker_service.cc).  Those 14,000 waiting calls are most of a server's memory: about
 * 41 MB a server with nothing placed on it, 7.7 MB with one serving thread (8 servers in one
 * process, PSS; bench/memory.py has the figures with tfmagic's clusters).  Python cannot pass other
 * options (only a ServerDef reaches GrpcServer::Init), so this library stands in for
 * tensorflow::NewGrpcWorkerService, which GrpcServer::Init calls through the procedure linkage
 * table: the wrapper sets num_serving_threads to TFMAGIC_SERVING_THREADS and calls TensorFlow's.
 * A serving thread only hands each arrived call to TensorFlow's thread pools and posts the next
 * request, so one keeps up with a laptop's cluster.
 *
 * The options struct is passed by address (it has an unordered_map, so the Itanium C++ ABI passes it
 * by invisible reference): { std::unordered_map<int,int> queue_depth; int num_serving_threads; },
 * the int 56 bytes in with libstdc++ on 64-bit Linux.  The wrapper changes it only where it reads
 * TensorFlow's default there (8): any other value means another layout or a caller's own choice,
 * and the call passes through unchanged (tfmagic_serving_threads_changed() counts the changes, so
 * tfmagic can say when nothing was).
 *
 * Task processes get this with LD_PRELOAD (the bind library, bindhost.c, is the same file) and the
 * variable; the notebook kernel, already running, gets tfmagic_serving_threads_loaded(), which
 * points the entries of TensorFlow's loaded libraries at the wrapper, as bindhost.c does for bind.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

#define NEW_SERVICE                                                                                \
    "_ZN10tensorflow20NewGrpcWorkerServiceEPNS_10GrpcWorkerEPN4grpc13ServerBuilderENS_"            \
    "24GrpcWorkerServiceOptionsE"
#define DEFAULT_THREADS 8
#define THREADS_OFFSET 56

/* rdi: where the unique_ptr is returned; then the worker, the builder, &options */
typedef void *(*new_service_fn)(void *, void *, void *, void *);

int tfmagic_patch_got(const char *match, const char *symbol, void *to); /* bindhost.c */

static new_service_fn real_new_service;
static int wanted = -1; /* -1: leave TensorFlow's default */
static int changed;

static void read_wanted(void) {
    const char *text = getenv("TFMAGIC_SERVING_THREADS");
    if (!text || !*text) return;
    char *end = NULL;
    long n = strtol(text, &end, 10);
    if (end && *end == '\0' && n >= 1 && n <= 64) wanted = (int)n;
}

__attribute__((constructor)) static void load_serving_threads(void) { read_wanted(); }

/* TensorFlow's own function: the next definition after this library, or, where TensorFlow was
 * loaded into a local scope (dlopen without RTLD_GLOBAL), the one in libtensorflow_cc itself. */
static int find_in(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libtensorflow_cc")) return 0;
    void *handle = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
    if (!handle) return 0;
    void *fn = dlvsym(handle, NEW_SERVICE, "tensorflow");
    if (!fn) fn = dlsym(handle, NEW_SERVICE);
    dlclose(handle);
    *(void **)data = fn;
    return fn != NULL;
}

static new_service_fn tensorflows(void) {
    new_service_fn fn = __atomic_load_n(&real_new_service, __ATOMIC_ACQUIRE);
    if (fn) return fn;
    void *found = NULL;
    dl_iterate_phdr(find_in, &found);
    if (!found) found = dlvsym(RTLD_NEXT, NEW_SERVICE, "tensorflow");
    if (!found) found = dlsym(RTLD_NEXT, NEW_SERVICE);
    __atomic_store_n(&real_new_service, (new_service_fn)found, __ATOMIC_RELEASE);
    return (new_service_fn)found;
}

static void *new_service(void *result, void *worker, void *builder, void *options) {
    int *threads = (int *)((char *)options + THREADS_OFFSET);
    if (wanted > 0 && *threads == DEFAULT_THREADS) {
        *threads = wanted;
        __atomic_add_fetch(&changed, 1, __ATOMIC_RELAXED);
    }
    new_service_fn fn = tensorflows();
    if (!fn) abort(); /* TensorFlow called a function of its own that is not there: cannot happen */
    return fn(result, worker, builder, options);
}

void *_ZN10tensorflow20NewGrpcWorkerServiceEPNS_10GrpcWorkerEPN4grpc13ServerBuilderENS_24GrpcWorkerServiceOptionsE(
    void *result, void *worker, void *builder, void *options) {
    return new_service(result, worker, builder, options);
}

/* How many servers of this process got `wanted` serving threads. */
int tfmagic_serving_threads_changed(void) { return __atomic_load_n(&changed, __ATOMIC_RELAXED); }

/* The running process: servers started from now on by the libraries under `match` get `threads`
 * serving threads; returns how many entries now point at the wrapper (0: none could). */
int tfmagic_serving_threads_loaded(const char *match, int threads) {
    if (!match || threads < 1 || threads > 64) return -1;
    if (!tensorflows()) return 0;
    __atomic_store_n(&wanted, threads, __ATOMIC_SEQ_CST);
    return tfmagic_patch_got(match, NEW_SERVICE, (void *)new_service);
}
