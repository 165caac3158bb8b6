/* devices.c - lmx_devices: what each backend built in can run on (the cpu, each cuda device).
 * The cpu's facts come from Linux (/proc/cpuinfo, /proc/meminfo, sysconf, uname). */
#define _GNU_SOURCE
#include "backend.h"
#include "cpu/kernels.h"
#include "../model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

/* The value after "key<spaces>:" of the first line of f that starts with key, into out. */
static int file_field(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    size_t kl = strlen(key);
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) != 0 || (line[kl] != ' ' && line[kl] != '\t' && line[kl] != ':')) continue;
        char *v = strchr(line + kl, ':');
        if (!v) continue;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        size_t n = strcspn(v, "\n");
        if (n >= cap) n = cap - 1;
        memcpy(out, v, n);
        out[n] = 0;
        found = 0;
        break;
    }
    fclose(f);
    return found;
}

/* Whether word w is one of the space-separated words of list. */
static int has_word(const char *list, const char *w) {
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

static void append(char *dst, size_t cap, const char *s) {
    size_t l = strlen(dst);
    if (l + strlen(s) + 2 > cap) return;
    if (l) dst[l++] = ' ';
    strcpy(dst + l, s);
}

static void cpu_device(lmx_device_info *d) {
    memset(d, 0, sizeof *d);
    snprintf(d->backend, sizeof d->backend, "cpu");
    struct utsname u;
    int have_uname = uname(&u) == 0;
    if (file_field("/proc/cpuinfo", "model name", d->name, sizeof d->name) && have_uname)
        snprintf(d->name, sizeof d->name, "%s", u.machine); /* e.g. arm64 boards name no model */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    d->cores = cores > 0 ? (int)cores : 1;
    struct sysinfo si;
    if (sysinfo(&si) == 0) {
        d->total_memory = (int64_t)si.totalram * si.mem_unit;
        d->free_memory = (int64_t)si.freeram * si.mem_unit;
    }
    char avail[64];
    if (!file_field("/proc/meminfo", "MemAvailable", avail, sizeof avail))
        d->free_memory = (int64_t)strtoll(avail, NULL, 10) * 1024; /* "123456 kB" */
    /* the instruction sets lmx's kernels care about, as the kernel names them */
    static const char *const wanted[] = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                         "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                                         "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm"};
    char *flags = malloc(16384);
    if (flags && (!file_field("/proc/cpuinfo", "flags", flags, 16384) ||
                  !file_field("/proc/cpuinfo", "Features", flags, 16384)))
        for (size_t i = 0; i < sizeof wanted / sizeof *wanted; i++)
            if (has_word(flags, wanted[i])) append(d->features, sizeof d->features, wanted[i]);
    free(flags);
    lmx_cpu_kernels k;
    lmx_cpu_kernels_init(&k, getenv("LMX_CPU_ISA"));
    char kern[48];
    snprintf(kern, sizeof kern, "kernels=%s", k.isa);
    append(d->features, sizeof d->features, kern);
    if (have_uname) snprintf(d->driver_version, sizeof d->driver_version, "%.16s %.46s", u.sysname, u.release);
#if defined(__GLIBC__)
    snprintf(d->runtime_version, sizeof d->runtime_version, "glibc %s", gnu_get_libc_version());
#endif
}

lmx_status lmx_devices(lmx_device_info *out, int cap, int *n) {
    lmx_err err = {0};
    if (!n || cap < 0 || (cap > 0 && !out)) {
        lmx_status st = lmx_err_set(&err, LMX_ERR_INVALID_ARG, "lmx_devices: %s", !n ? "n is NULL" : "no room for cap entries");
        lmx_set_thread_error(&err);
        return st;
    }
    int count = 0;
    if (count < cap) cpu_device(&out[count]);
    count++;
#ifdef LMX_HAVE_CUDA
    int nd = lmx_cuda_device_count();
    for (int i = 0; i < nd; i++, count++) {
        if (count >= cap) continue;
        lmx_status st = lmx_cuda_device_info(i, &out[count], &err);
        if (st) {
            lmx_set_thread_error(&err);
            *n = count;
            return st;
        }
    }
#endif
    *n = count;
    return LMX_OK;
}
