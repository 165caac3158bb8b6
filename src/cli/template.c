/* template.c - `lmx template` (being written; see issue 3). */
#include <stdio.h>

#include "cli.h"

int cmd_template(int argc, char **argv) {
    fprintf(stderr, "lmx: template is not available in this build yet\n");
    return 1;
}
