/* yaml_config.c - a YAML training config as the JSON object `lmx train --config` reads (libyaml's
 * event parser): one mapping of plain keys to scalars or to lists of scalars, the way YAML training
 * configs are written.  Scalars become JSON as YAML 1.1 would type them: true/false (yes/no, on/off),
 * numbers, null, else strings (quoted scalars stay strings).  Anything else is an error naming the
 * line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <yaml.h>

#include "base/status.h"
#include "cli.h"

/* A plain scalar as YAML 1.1 types it; a quoted one is a string. */
static cJSON *scalar(const yaml_event_t *ev) {
    const char *v = (const char *)ev->data.scalar.value;
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return cJSON_CreateString(v);
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) return cJSON_CreateBool(1);
    if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) return cJSON_CreateBool(0);
    if (!*v || !strcmp(v, "~") || !strcasecmp(v, "null")) return cJSON_CreateNull();
    char *end = NULL;
    const double d = strtod(v, &end);
    if (end && end != v && !*end) return cJSON_CreateNumber(d);
    return cJSON_CreateString(v);
}

cJSON *cli_yaml_object(const char *text, size_t len, char *msg, size_t cap) {
    yaml_parser_t p;
    yaml_event_t ev;
    if (!yaml_parser_initialize(&p)) {
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    cJSON *obj = NULL, *list = NULL;
    char *key = NULL;
    int depth = 0, done = 0, ok = 1; /* depth: 1 in the document's mapping, 2 in a list */
    while (ok && !done) {
        if (!yaml_parser_parse(&p, &ev)) {
            snprintf(msg, cap, "line %lu: %s", (unsigned long)p.problem_mark.line + 1,
                     p.problem ? p.problem : "not YAML");
            ok = 0;
            break;
        }
        const unsigned long line = (unsigned long)ev.start_mark.line + 1;
        switch (ev.type) {
        case YAML_STREAM_START_EVENT: case YAML_DOCUMENT_START_EVENT: case YAML_DOCUMENT_END_EVENT: break;
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_MAPPING_START_EVENT:
            if (obj) {
                char kb[72]; /* the key quoted (lmx_quote: escaped and shortened, so the message stays one line) */
                snprintf(msg, cap, "line %lu: %s: a nested mapping (use a flat key: value list)", line,
                         lmx_quote_str(kb, sizeof kb, key));
                ok = 0;
            } else {
                obj = cJSON_CreateObject();
                depth = 1;
            }
            break;
        case YAML_MAPPING_END_EVENT: depth = 0; break;
        case YAML_SEQUENCE_START_EVENT:
            if (depth != 1 || !key) {
                snprintf(msg, cap, "line %lu: a list where a key or a value of the top mapping belongs", line);
                ok = 0;
            } else {
                list = cJSON_CreateArray();
                depth = 2;
            }
            break;
        case YAML_SEQUENCE_END_EVENT:
            cJSON_AddItemToObject(obj, key, list);
            list = NULL, free(key), key = NULL, depth = 1;
            break;
        case YAML_SCALAR_EVENT:
            if (depth == 2) cJSON_AddItemToArray(list, scalar(&ev));
            else if (depth == 1 && !key) key = strdup((const char *)ev.data.scalar.value);
            else if (depth == 1) cJSON_AddItemToObject(obj, key, scalar(&ev)), free(key), key = NULL;
            else {
                snprintf(msg, cap, "line %lu: not a mapping of settings", line);
                ok = 0;
            }
            break;
        default:
            snprintf(msg, cap, "line %lu: anchors and aliases are not read", line);
            ok = 0;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    free(key);
    cJSON_Delete(list);
    if (ok && !obj) snprintf(msg, cap, "no mapping of settings"), ok = 0;
    if (!ok) cJSON_Delete(obj);
    return ok ? obj : NULL;
}
