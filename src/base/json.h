/* json.h - reading optional members of a cJSON object: a string, a number or a bool, or what to use
 * when it is absent or of another type. */
#ifndef LMX_BASE_JSON_H
#define LMX_BASE_JSON_H

#include <cjson/cJSON.h>

static inline const char *lmx_json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static inline double lmx_json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}
static inline int lmx_json_bool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

#endif
