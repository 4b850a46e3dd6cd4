/* A process that sees FAKE_NPROCS cores (LD_PRELOAD), for tests/e2e/test_thor_statistics_dtype.py: glibc's
 * get_nprocs() is what std::thread::hardware_concurrency() returns, which sizes MindSpore's kernel thread pool, which
 * is the most threads oneDNN's float32 GEMM splits a sum between. So a training in such a process splits THOR's
 * statistics as a machine with that many cores does. Unset or not positive: the real count. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/sysinfo.h>
#include <unistd.h>

static int fake_count(void) {
    const char *value = getenv("FAKE_NPROCS");
    return value ? atoi(value) : 0;
}

int get_nprocs(void) {
    int (*real)(void) = (int (*)(void))dlsym(RTLD_NEXT, "get_nprocs");
    return fake_count() > 0 ? fake_count() : real();
}

int get_nprocs_conf(void) {
    int (*real)(void) = (int (*)(void))dlsym(RTLD_NEXT, "get_nprocs_conf");
    return fake_count() > 0 ? fake_count() : real();
}

long sysconf(int name) {
    long (*real)(int) = (long (*)(int))dlsym(RTLD_NEXT, "sysconf");
    if (fake_count() > 0 && (name == _SC_NPROCESSORS_ONLN || name == _SC_NPROCESSORS_CONF)) return fake_count();
    return real(name);
}
