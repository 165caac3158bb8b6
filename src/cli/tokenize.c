/* tokenize.c - `lmx tokenize` (being written; see issue 3). */
#include <stdio.h>

#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    fprintf(stderr, "lmx: tokenize is not available in this build yet\n");
    return 1;
}
