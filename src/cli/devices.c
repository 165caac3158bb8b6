/* devices.c - `lmx devices`: what each backend built into lmx can run on. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "lmx.h"

#define MAX_DEVICES 64

static void gib(char *buf, size_t cap, int64_t bytes) {
    if (bytes > 0) snprintf(buf, cap, "%.1f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
    else snprintf(buf, cap, "unknown");
}

int cmd_devices(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: lmx devices\n\n"
                   "Lists the devices of every backend built in: the cpu (name, cores, instruction sets, the\n"
                   "kernels lmx uses, memory, OS and C library) and each CUDA GPU (name, compute capability,\n"
                   "SM count, memory, driver and runtime versions).\n");
            return 0;
        }
        return cli_usage_error("devices: unknown argument \"%s\"", argv[i]);
    }
    lmx_device_info d[MAX_DEVICES];
    int n = 0;
    if (lmx_devices(d, MAX_DEVICES, &n) != LMX_OK) {
        fprintf(stderr, "lmx: devices: %s\n", lmx_last_error(NULL));
        return 1;
    }
    for (int i = 0; i < n && i < MAX_DEVICES; i++) {
        char total[32], avail[32];
        gib(total, sizeof total, d[i].total_memory);
        gib(avail, sizeof avail, d[i].free_memory);
        printf("%s:%d  %s\n", d[i].backend, d[i].index, d[i].name[0] ? d[i].name : "(unnamed)");
        if (!strcmp(d[i].backend, "cpu")) {
            printf("  cores: %d\n", d[i].cores);
            printf("  instruction sets: %s\n", d[i].features[0] ? d[i].features : "(unknown)");
        } else {
            printf("  compute capability: %d.%d, %d SMs\n", d[i].cc_major, d[i].cc_minor, d[i].sm_count);
        }
        printf("  memory: %s total, %s free\n", total, avail);
        printf("  driver: %s, runtime: %s\n", d[i].driver_version[0] ? d[i].driver_version : "unknown",
               d[i].runtime_version[0] ? d[i].runtime_version : "unknown");
    }
    return 0;
}
