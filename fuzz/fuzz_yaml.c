/* fuzz_yaml.c - the YAML reader of `lmx train --config FILE.yaml` (src/cli/yaml_config.c, linked in):
 * the bytes as a config file's text.  It must give a JSON object of settings, or NULL with a one-line
 * message naming what is wrong; never a crash, a leak or a hang. */
#include <cjson/cJSON.h>

#include "fuzz.h"

#include "cli/cli.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char msg[256] = "";
    cJSON *obj = cli_yaml_object((const char *)data, size, msg, sizeof msg);
    if (obj) {
        FZ_ASSERT(cJSON_IsObject(obj));
        const cJSON *it;
        cJSON_ArrayForEach(it, obj) { /* each setting: a scalar, or a list of scalars */
            FZ_ASSERT(it->string != NULL);
            if (cJSON_IsArray(it)) {
                const cJSON *e;
                cJSON_ArrayForEach(e, it) FZ_ASSERT(!cJSON_IsArray(e) && !cJSON_IsObject(e));
            } else FZ_ASSERT(!cJSON_IsObject(it));
        }
        cJSON_Delete(obj);
    } else {
        FZ_ASSERT(msg[0] && one_line_utf8(msg));
    }
    return 0;
}
