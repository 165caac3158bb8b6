/* fileio.h - read-only memory mapping and whole-file reads. */
#ifndef LMX_BASE_FILEIO_H
#define LMX_BASE_FILEIO_H

#include <stddef.h>
#include "status.h"

typedef struct lmx_mmap {
    void *data;    /* NULL for an empty file */
    size_t size;
} lmx_mmap;

/* Map path read-only.  Errors name the file (LMX_ERR_IO). */
lmx_status lmx_mmap_open(const char *path, lmx_mmap *out, lmx_err *err);
void lmx_mmap_close(lmx_mmap *m);

/* Read a whole file into a malloc'ed, NUL-terminated buffer the caller frees. */
lmx_status lmx_read_file(const char *path, char **out, size_t *out_size, lmx_err *err);

/* Write n bytes to path (created or truncated); on failure no partial file is left (LMX_ERR_IO). */
lmx_status lmx_write_file(const char *path, const void *data, size_t n, lmx_err *err);

/* 1 when path exists and is a regular file / a directory. */
int lmx_is_file(const char *path);
int lmx_is_dir(const char *path);

/* 1 when s ends with suffix (a file name's extension, a tensor name's last part). */
int lmx_ends_with(const char *s, const char *suffix);

/* Join dir and name with '/' into a malloc'ed string (NULL on allocation failure). */
char *lmx_path_join(const char *dir, const char *name);

#endif
