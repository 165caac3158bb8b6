/* test_chat_template.c - chat templates (src/tokenizer/chat_template.c) and the Jinja engine under
 * them (src/tokenizer/jinja*.c):
 *   1. every row of tokenizers/{qwen3,llama3,gemma3}.public.chat.jsonl renders to its `text`
 *      (transformers' apply_chat_template output);
 *   2. the real gemma-3-270m-it template (chat_template.jinja) renders conversations exactly as
 *      jinja2 does and raises its own error for non-alternating roles;
 *   3. a table of small templates -> output, every expectation produced by jinja2 3.1 configured
 *      as transformers configures it (trim_blocks, lstrip_blocks, ImmutableSandboxedEnvironment,
 *      loopcontrols, transformers' tojson): whitespace control, literals, access, slicing,
 *      operators, if/for/loop variables, set/namespace, macros, filters, tests, str/dict methods;
 *   4. errors (syntax with line and column, unknown filter/test, raise_exception, undefined use,
 *      runaway loops and recursion) come back as a status and a message;
 *   5. loading: chat_template.jinja preferred, list-form "chat_template", {"content"} special
 *      tokens, built-in family formats, missing templates; and `lmx template` when LMX_BIN is set.
 *
 * Usage: test_chat_template [FIXTURES]   (default: $LMX_FIXTURES). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fileio.h"
#include "check.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

/* ---- 1. fixture conversations ----------------------------------------------------------------- */
static void test_fixture(const char *fixtures, const char *name) {
    char dir[1024], path[1024];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", fixtures, name);
    snprintf(path, sizeof path, "%s/tokenizers/%s.public.chat.jsonl", fixtures, name);
    lmx_err err = {0};
    lmx_chat_template *t = NULL;
    CHECK_MSG(lmx_chat_template_load(dir, NULL, &t, &err) == LMX_OK, "%s: %s", dir, err.msg);
    FILE *fp = fopen(path, "r");
    CHECK_MSG(fp != NULL, "cannot open %s", path);
    if (!t || !fp) {
        if (fp) fclose(fp);
        lmx_chat_template_free(t);
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    int rows = 0;
    while (getline(&line, &cap, fp) > 0) {
        cJSON *row = cJSON_Parse(line);
        CHECK(row != NULL);
        if (!row) continue;
        const cJSON *want = cJSON_GetObjectItem(row, "text");
        char *got = NULL;
        lmx_status s = lmx_chat_template_render(
            t, cJSON_GetObjectItem(row, "messages"),
            cJSON_IsTrue(cJSON_GetObjectItem(row, "add_generation_prompt")),
            cJSON_GetObjectItem(row, "kwargs"), NULL, &got, &err);
        CHECK_MSG(s == LMX_OK, "%s row %d: %s", name, rows, err.msg);
        CHECK_MSG(got && cJSON_IsString(want) && !strcmp(got, want->valuestring),
                  "%s row %d:\n got: %s\nwant: %s", name, rows, got ? got : "(null)",
                  cJSON_IsString(want) ? want->valuestring : "(none)");
        free(got);
        cJSON_Delete(row);
        rows++;
    }
    CHECK_MSG(rows >= 8, "%s: only %d rows", name, rows);
    free(line);
    fclose(fp);
    lmx_chat_template_free(t);
}

/* ---- 2. the real gemma-3-270m-it template ----------------------------------------------------- */
static char *render_json(const lmx_chat_template *t, const char *messages, int agp, lmx_err *err,
                         lmx_status *st) {
    cJSON *m = cJSON_Parse(messages);
    char *out = NULL;
    *st = lmx_chat_template_render(t, m, agp, NULL, NULL, &out, err);
    cJSON_Delete(m);
    return out;
}

static void test_gemma_270m(const char *fixtures) {
    static const struct { const char *messages; int agp; const char *want; } cases[] = {
        {"[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
         "{\"role\":\"assistant\",\"content\":\"Hello!\"},{\"role\":\"user\",\"content\":\"Why is the sky blue?\"}]",
         1,
         "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!"
         "<end_of_turn>\n<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n"},
        {"[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\" Describe \"},{\"type\":\"image\"},"
         "{\"type\":\"text\",\"text\":\"this\"}]}]",
         1, "<bos><start_of_turn>user\nDescribe<start_of_image>this<end_of_turn>\n<start_of_turn>model\n"},
        {"[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"Sys\"}]},{\"role\":\"user\",\"content\":\"Q\"}]",
         0, "<bos><start_of_turn>user\nSys\n\nQ<end_of_turn>\n"},
    };
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/real/configs/gemma-3-270m-it", fixtures);
    lmx_err err = {0};
    lmx_chat_template *t = NULL;
    CHECK_MSG(lmx_chat_template_load(dir, NULL, &t, &err) == LMX_OK, "%s: %s", dir, err.msg);
    if (!t) return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lmx_status st;
        char *got = render_json(t, cases[i].messages, cases[i].agp, &err, &st);
        CHECK_MSG(st == LMX_OK, "gemma-3-270m-it case %zu: %s", i, err.msg);
        CHECK_MSG(got && !strcmp(got, cases[i].want), "gemma-3-270m-it case %zu:\n got: %s\nwant: %s",
                  i, got ? got : "(null)", cases[i].want);
        if (got) {
            CHECK_CONTAINS(got, "<start_of_turn>user\n");
            CHECK_CONTAINS(got, "<end_of_turn>\n");
        }
        free(got);
    }
    lmx_status st;
    char *got = render_json(t, "[{\"role\":\"assistant\",\"content\":\"x\"}]", 1, &err, &st);
    CHECK(st == LMX_ERR_INVALID_ARG && got == NULL);
    CHECK_CONTAINS(err.msg, "Conversation roles must alternate user/assistant/user/assistant/...");
    lmx_chat_template_free(t);
}

/* ---- 3. engine table (expectations from jinja2) ----------------------------------------------- */
static const struct { const char *tpl, *vars, *want; } ENGINE_CASES[] = {
    {"a\n{% if true %}\n  x\n{% endif %}\nb",
     NULL,
     "a\n  x\nb"},
    {"a\n  {% if true %}\n  x\n  {% endif %}\nb",
     NULL,
     "a\n  x\nb"},
    {"a  {%- if true -%}  x  {%- endif -%}  b",
     NULL,
     "axb"},
    {"a  {{- 'x' -}}  b",
     NULL,
     "axb"},
    {"a\n  {{ 'x' }}\nb",
     NULL,
     "a\n  x\nb"},
    {"a\n  {%+ if true %}x{% endif +%}\nb",
     NULL,
     "a\n  x\nb"},
    {"a {# comment #}\nb\n  {# c2 #}\nc {#- c3 -#}  d",
     NULL,
     "a b\ncd"},
    {"line\n",
     NULL,
     "line"},
    {"line\n\n",
     NULL,
     "line\n"},
    {"x\015\ny\015z",
     NULL,
     "x\ny\nz"},
    {"{% raw %}{{ not }}{% endraw %}",
     NULL,
     "{{ not }}"},
    {"  {% raw %} {{ x }} {% endraw %}\nq",
     NULL,
     " {{ x }} q"},
    {"{% for i in [1,2] %}\n{{ i }}\n{% endfor %}\n",
     NULL,
     "1\n2\n"},
    {"{% for i in [1,2] -%}\n  {{ i }}\n{%- endfor %}",
     NULL,
     "12"},
    {"{{ 'a' }}{{ 'b' }}\n  {{ 'c' }}",
     NULL,
     "ab\n  c"},
    {"   {% set x = 1 %}{{ x }}",
     NULL,
     "1"},
    {"\t{% if true %}y{% endif %}",
     NULL,
     "y"},
    {"x {% if true %}y{% endif %}",
     NULL,
     "x y"},
    {"{{ 'a\\nb\\tc\\\\d\\'e\\x41\\u00e9\\U0001F600' }}",
     NULL,
     "a\nb\tc\\d'eAé😀"},
    {"{{ \"dq \\\"x\\\"\" }}{{ 'a' \"b\" }}",
     NULL,
     "dq \"x\"ab"},
    {"{{ 1 }} {{ -3 }} {{ 1.5 }} {{ 2.0 }} {{ 1e3 }} {{ 1_000 }} {{ 0.1 + 0.2 "
     "}}",
     NULL,
     "1 -3 1.5 2.0 1000.0 1000 0.30000000000000004"},
    {"{{ true }} {{ True }} {{ none }} {{ None }} {{ false }}",
     NULL,
     "True True None None False"},
    {"{{ [1, 'a', none, true, 1.5, {'k': [2]}] }}",
     NULL,
     "[1, 'a', None, True, 1.5, {'k': [2]}]"},
    {"{{ {'a': 1, 'b': 'x'} }}",
     NULL,
     "{'a': 1, 'b': 'x'}"},
    {"{{ (1, 2) }}{{ () }}{{ [] }}{{ {} }}",
     NULL,
     "(1, 2)()[]{}"},
    {"{{ \"it's\" }}|{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}",
     NULL,
     "it's|[\"it's\", 'say \"hi\"', 'both \\' \"']"},
    {"{{ x }}|{{ x is defined }}|{{ y.a }}|{{ y['a'] }}|{{ y.b }}|{{ z[1] }}"
     "|{{ z[-1] }}|{{ z[5] }}",
     "{\"y\": {\"a\": 1}, \"z\": [1, 2, 3]}",
     "|False|1|1||2|3|"},
    {"{{ y['items'] }}",
     "{\"y\": {\"items\": 1}}",
     "1"},
    {"{{ none.x }}|",
     NULL,
     "|"},
    {"{{ 'abc'[1] }}{{ 'héllo'[1] }}{{ 'abc'[-1] }}",
     NULL,
     "béc"},
    {"{{ z.0 }}",
     "{\"z\": [7]}",
     "7"},
    {"{{ z[1:] }}{{ z[:2] }}{{ z[::-1] }}{{ z[::2] }}{{ z[-2:] }}{{ z[1:-1] "
     "}}{{ z[5:] }}{{ z[3:0:-1] }}",
     "{\"z\": [1, 2, 3, 4]}",
     "[2, 3, 4][1, 2][4, 3, 2, 1][1, 3][3, 4][2, 3][][4, 3, 2]"},
    {"{{ 'hello'[::-1] }}|{{ 'héllo'[1:3] }}|{{ 'abc'[:-1] }}",
     NULL,
     "olleh|él|ab"},
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 "
     "}} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 4 / 2 }}",
     NULL,
     "7 9 3 -4 1 2 3.5 1024 2.0"},
    {"{{ 'a' ~ 1 ~ none ~ true }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' * "
     "3 }} {{ 1.5 * 2 }}",
     NULL,
     "a1NoneTrue ab [1, 2] ababab 3.0"},
    {"{{ '' * 1000000000000 }}|{{ ([] * 1000000000000)|length }}|{{ 'ab' * -2 }}|", NULL, "|0||"},
    {"{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' "
     "}} {{ [1,2] < [1,3] }} {{ true == 1 }}",
     NULL,
     "True True True False True True True"},
    {"{{ 'a' in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in "
     "'abc' }} {{ not 'x' in 'abc' }}",
     NULL,
     "True True True True True"},
    {"{{ 1 and 'x' }} {{ 0 or 'y' }} {{ none or '' }} {{ not 0 }} {{ not [] "
     "}}",
     NULL,
     "x y  True True"},
    {"{{ 'yes' if 1 else 'no' }} {{ 'yes' if 0 else 'no' }} [{{ 'yes' if 0 }"
     "}]",
     NULL,
     "yes no []"},
    {"{{ -x|abs }}",
     "{\"x\": 3}",
     "3"},
    {"{% for n in [1,2,3,4] %}{% if n == 1 %}one{% elif n == 2 %}two{% elif "
     "n == 3 %}three{% else %}many{% endif %},{% endfor %}",
     NULL,
     "one,two,three,many,"},
    {"{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last "
     "}}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %"
     "}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "10TrueFalse332;21FalseFalse321;32FalseTrue310;"},
    {"{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}/{{ loop.length }}"
     " {% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "a1/2 c2/2 "},
    {"{% for x in [] %}x{% else %}empty{% endfor %}",
     NULL,
     "empty"},
    {"{% for x in xs if false %}x{% else %}none{% endfor %}",
     "{\"xs\": [1]}",
     "none"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "{\"d\": {\"a\": 1, \"b\": 2}}",
     "a=1;b=2;"},
    {"{% for k in d %}{{ k }}{% endfor %}",
     "{\"d\": {\"a\": 1, \"b\": 2}}",
     "ab"},
    {"{% for ch in 'héy' %}{{ ch }}.{% endfor %}",
     NULL,
     "h.é.y."},
    {"{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if "
     "x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     NULL,
     "13"},
    {"{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }}"
     " {% endfor %}{{ loop.index }}|{% endfor %}",
     NULL,
     "113 214 1|123 224 2|"},
    {"{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('o',"
     "'e') }} {% endfor %}",
     NULL,
     "-2-o 1-3-e 2--o "},
    {"{% for x in u %}a{% endfor %}ok",
     NULL,
     "ok"},
    {"{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %"
     "}{{ i }}{% endfor %}{{ range(5, 0, -2) | list }}",
     NULL,
     "012135[5, 3, 1]"},
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ "
     "x }}",
     NULL,
     "21"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}",
     NULL,
     "12(1, 2)"},
    {"{% set ns = namespace(n=0, s='') %}{% for i in [1,2,3] %}{% set ns.n = "
     "ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
     NULL,
     "6 123"},
    {"{% set ns = namespace() %}{% set ns.x = 5 %}{{ ns.x }}{{ ns.y }}",
     NULL,
     "5"},
    {"{% set x %}captured {{ 1 + 1 }}{% endset %}[{{ x }}]",
     NULL,
     "[captured 2]"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro "
     "%}{{ greet('Bob') }} {{ greet('Al', punct='\?') }} {{ greet(name='X') "
     "}}",
     NULL,
     "Hi Bob! Hi Al\? Hi X!"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro "
     "%}{{ f(3) }}",
     NULL,
     "321"},
    {"{% macro f() %}{{ g }}{% endmacro %}{% set g = 'top' %}{{ f() }}",
     NULL,
     "top"},
    {"[{{ '  x y  '|trim }}] [{{ 'xxhixx'|trim('x') }}] {{ 'abc'|upper }} {{ "
     "'ABC'|lower }} {{ 'hello world-foo bAR'|title }} {{ 'hELLO'|capitalize "
     "}}",
     NULL,
     "[x y] [hi] ABC abc Hello World-Foo Bar Hello"},
    {"{{ [1,2,3]|length }} {{ 'héllo'|length }} {{ {'a':1}|length }} {{ u|length "
     "}} {{ [1,2]|count }}",
     NULL,
     "3 5 1 0 2"},
    {"{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'abc'|first }} {{ []|first }"
     "}",
     NULL,
     "1 3 a "},
    {"{{ [1,2,3]|join(', ') }} {{ ['a','b']|join }} {{ [{'n':'x'},{'n':'y'}]|join('-',"
     " attribute='n') }}",
     NULL,
     "1, 2, 3 ab x-y"},
    {"{{ u|default('dflt') }} {{ ''|default('e') }} {{ ''|default('e', true) "
     "}} {{ none|default('n') }} {{ u|d('d') }}",
     NULL,
     "dflt  e None d"},
    {"{{ 1|string }}{{ [1]|string }} {{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'x'|int "
     "}} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 3|float }}",
     NULL,
     "1[1] 43 4 0 7 3 2.5 3.0"},
    {"{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|items|list }} {{ (1, 2)|list }}",
     NULL,
     "['a', 'b', 'c'] [('a', 1), ('b', 2)] [1, 2]"},
    {"{{ xs|selectattr('role', 'equalto', 'user')|map(attribute='c')|join(',"
     "') }}|{{ xs|rejectattr('role', 'eq', 'user')|list|length }}|{{ xs|selectattr('flag')|list|length "
     "}}",
     "{\"xs\": [{\"role\": \"user\", \"c\": \"1\", \"flag\": true}, {\"role\": "
     "\"bot\", \"c\": \"2\"}, {\"role\": \"user\", \"c\": \"3\"}]}",
     "1,3|1|1"},
    {"{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('even')|list }}"
     " {{ [0,1,'',none,'a']|select|list }} {{ ['a','b']|map('upper')|list }}"
     "",
     NULL,
     "[1, 3] [1, 3] [1, 'a'] ['A', 'B']"},
    {"{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ [3,"
     "1,2]|sort }} {{ ['b','A','c']|sort }} {{ [3,1,2]|sort(reverse=true) }}"
     " {{ [1,2,3]|reverse|list }} {{ 'abc'|reverse }}",
     NULL,
     "a+b+c bba [1, 2, 3] ['A', 'b', 'c'] [3, 2, 1] [3, 2, 1] cba"},
    {"{{ [{'n':2},{'n':1}]|sort(attribute='n')|map(attribute='n')|list }} {{ "
     "{'b':1,'a':2}|dictsort }} {{ [1,2,2,'A','a']|unique|list }} {{ [3,1,2]|min "
     "}} {{ [3,1,2]|max }} {{ [1,2,3]|sum }}",
     NULL,
     "[1, 2] [('a', 2), ('b', 1)] [1, 2, 'A'] 1 3 6"},
    {"{{ 2.5|round }} {{ 3.14159|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ -3|abs "
     "}} {{ '<a & \"b\">'|e }} {{ 'x'|safe }}",
     NULL,
     "2.0 3.14 3.0 3 &lt;a &amp; &#34;b&#34;&gt; x"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2,"
     " blank=true) }}",
     NULL,
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b"},
    {"{{ x|tojson }}",
     "{\"x\": {\"a\": [1, 2.5, null, true, \"é\\\"\\\\\\n\\t\\u0001\"], \"b\": "
     "{}, \"c\": []}}",
     "{\"a\": [1, 2.5, null, true, \"é\\\"\\\\\\n\\t\\u0001\"], \"b\": {}, \"c\": "
     "[]}"},
    {"{{ x|tojson(indent=2) }}",
     "{\"x\": {\"a\": [1, {\"b\": null}], \"e\": [], \"f\": {}}}",
     "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"e\": "
     "[],\n  \"f\": {}\n}"},
    {"{{ x|tojson(indent=4) }}|{{ 'x'|tojson }}|{{ 1.0|tojson }}|{{ 1e20|tojson "
     "}}",
     "{\"x\": [1]}",
     "[\n    1\n]|\"x\"|1.0|1e+20"},
    {"{{ x|tojson(sort_keys=true) }} {{ x|tojson(separators=(',', ':')) }} {{ "
     "'é'|tojson(ensure_ascii=true) }}",
     "{\"x\": {\"b\": 1, \"a\": 2}}",
     "{\"a\": 2, \"b\": 1} {\"b\":1,\"a\":2} \"\\u00e9\""},
    {"{{ x is defined }}{{ u is defined }}{{ u is undefined }}{{ none is none "
     "}}{{ 1 is none }}{{ 'a' is string }}{{ 1 is string }}",
     "{\"x\": 1}",
     "TrueFalseTrueTrueFalseTrueFalse"},
    {"{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable "
     "}}{{ 1 is iterable }}{{ [] is sequence }}{{ 1 is sequence }}",
     NULL,
     "TrueFalseTrueTrueFalseTrueFalse"},
    {"{{ 1 is number }}{{ 1.5 is number }}{{ 'a' is number }}{{ 1 is integer "
     "}}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ 1 is true "
     "}}{{ false is false }}{{ 0 is false }}",
     NULL,
     "TrueTrueFalseTrueTrueTrueTrueFalseTrueFalse"},
    {"{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 1 is eq 1 }}{{ "
     "1 is ne 1 }}{{ 'x' is in 'xy' }}{{ 2 is gt 1 }}{{ 'ab' is lower }}{{ 'AB' "
     "is upper }}{{ none is sameas none }}",
     NULL,
     "TrueTrueTrueTrueFalseTrueTrueTrueTrueTrue"},
    {"{{ u is not defined }}{{ x is not none }}",
     "{\"x\": 1}",
     "TrueTrue"},
    {"{% if x is string and x.startswith('a') %}s{% endif %}",
     "{\"x\": \"abc\"}",
     "s"},
    {"{{ not x is defined }}",
     NULL,
     "True"},
    {"{{ range is callable }}",
     NULL,
     "True"},
    {"{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x',"
     " 'h')) }}",
     NULL,
     "TrueTrueTrue"},
    {"{{ 'a,b,,c'.split(',') }}{{ '  a  b '.split() }}{{ 'a b c'.split(' ', "
     "1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b '.rsplit() }}",
     NULL,
     "['a', 'b', '', 'c']['a', 'b']['a', 'b c']['a,b', 'c']['a', 'b']"},
    {"[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}"
     "][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}]",
     NULL,
     "[x][x  ][  x][a][x\n]"},
    {"{{ 'aXbX'.replace('X', '-') }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ "
     "\"they're bill's\".title() }} {{ 'hello world'.capitalize() }}",
     NULL,
     "a-b- AB ab They'Re Bill'S Hello world"},
    {"{{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') "
     "}} {{ ', '.join(['a', 'b']) }} {{ '{} and {}'.format(1, 'x') }} {{ '{a}"
     "!'.format(a=2) }}",
     NULL,
     "2 -1 2 a, b 1 and x 2!"},
    {"{{ 'abc'.removeprefix('a') }}{{ 'abc'.removesuffix('c') }}{{ '12'.isdigit() "
     "}}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}",
     NULL,
     "bcabTrueTrueTrue"},
    {"{{ 'x</think>y'.split('</think>')[-1] }}|{{ 'a<think>\\nb\\n</think>\\n\\nc'.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') "
     "}}",
     NULL,
     "y|b"},
    {"{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys()|list "
     "}} {{ d.values()|list }} {{ d.items()|list }}",
     "{\"d\": {\"a\": 1, \"b\": [2]}}",
     "1 None 5 ['a', 'b'] [1, [2]] [('a', 1), ('b', [2])]"},
    {"{{ [1,2,1].count(1) }}{{ [1,2].index(2) }}",
     NULL,
     "21"},
    {"{%- macro render(t, indent='') -%}{{ indent }}{{ t.name }}{%- if t.children "
     "%}{% for ch in t.children %}\n{{ render(ch, indent ~ '  ') }}{% endfor "
     "%}{% endif %}{%- endmacro -%}{{ render(tree) }}",
     "{\"tree\": {\"name\": \"r\", \"children\": [{\"name\": \"a\", \"children\": "
     "[{\"name\": \"b\"}]}, {\"name\": \"c\"}]}}",
     "r  a    b  c"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role "
     "}}{% endfor %}{% for m in messages %}{% if m.content is not string %}{{ "
     "m.content|selectattr('type', 'equalto', 'text')|map(attribute='text')|join('') "
     "}}{% endif %}{% endfor %}",
     "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": "
     "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": "
     "\"image\"}, {\"type\": \"text\", \"text\": \"b\"}]}]}",
     "1userab"},
    {"{{ '\\u2003 x \\u00a0'|trim }}|{{ ' \\u3000a'.strip() }}|{{ 'é'|upper "
     "}}{{ 'ÉCOLE'|lower }}{{ '日本語'[1] }}{{ '日本語'|reverse }}|{{ 'ab'|center(6) "
     "}}|",
     NULL,
     "x|a|Éécole本語本日|  ab  |"},
    {"{{ 1e300 * 1e300 }} {{ -0.0 }} {{ 1/3 }} {{ 2**0.5 }} {{ 123456789.123 "
     "}} {{ 7 // 2 * 2 }} {{ -2 ** 2 }} {{ 1 - - 1 }}",
     NULL,
     "inf -0.0 0.3333333333333333 1.4142135623730951 123456789.123 6 4 2"},
    {"{%- for i in range(xs|length - 1, -1, -1) %}{{ i }}{{ xs[i] }} {% endfor "
     "%}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "2c 1b 0a "},
    {"{{ 'a b'.split(' ') }}{{ ''.split() }}{{ ''.split(',') }}{{ 'a,'.split(',"
     "') }}",
     NULL,
     "['a', 'b'][]['']['a', '']"},
    {"a\n    {% if true -%}\n    b\n    {%- endif %}\n    c",
     NULL,
     "a\nb    c"},
    {"{{ dict(a=1, b='x') }} {{ dict(a=1).a }}",
     NULL,
     "{'a': 1, 'b': 'x'} 1"},

};

static void test_engine_table(void) {
    for (size_t i = 0; i < sizeof ENGINE_CASES / sizeof ENGINE_CASES[0]; i++) {
        lmx_err err = {0};
        lmx_jinja *t = NULL;
        char *out = NULL;
        cJSON *vars = ENGINE_CASES[i].vars ? cJSON_Parse(ENGINE_CASES[i].vars) : NULL;
        CHECK_MSG(!ENGINE_CASES[i].vars || vars, "case %zu: bad vars JSON", i);
        lmx_status s = lmx_jinja_parse(ENGINE_CASES[i].tpl, strlen(ENGINE_CASES[i].tpl), &t, &err);
        if (s == LMX_OK) s = lmx_jinja_render(t, vars, &out, &err);
        CHECK_MSG(s == LMX_OK, "case %zu %s: %s", i, ENGINE_CASES[i].tpl, err.msg);
        CHECK_MSG(out && !strcmp(out, ENGINE_CASES[i].want), "case %zu %s:\n got: [%s]\nwant: [%s]", i,
                  ENGINE_CASES[i].tpl, out ? out : "(null)", ENGINE_CASES[i].want);
        free(out);
        lmx_jinja_free(t);
        cJSON_Delete(vars);
    }
}

/* ---- 4. errors ------------------------------------------------------------------------------- */
static void test_errors(void) {
    static const struct { const char *tpl; lmx_status status; const char *msg; } cases[] = {
        {"{% if x %}", LMX_ERR_FORMAT, "line 1, column 11: unexpected end of template, expected 'endif'"},
        {"a\n{% for x in y %}", LMX_ERR_FORMAT, "expected 'endfor'"},
        {"{{ x | nosuchfilter }}", LMX_ERR_FORMAT, "no filter named 'nosuchfilter'"},
        {"{{ x is nosuchtest }}", LMX_ERR_FORMAT, "no test named 'nosuchtest'"},
        {"{% for %}", LMX_ERR_FORMAT, "line 1, column 8"},
        {"{{ 'abc }}", LMX_ERR_FORMAT, "unterminated string"},
        {"{{ '\\UFFFFFFFF' }}", LMX_ERR_FORMAT, "escape out of the Unicode range"},
        {"{% endif %}", LMX_ERR_FORMAT, "unknown or unexpected tag"},
        {"{{ }}", LMX_ERR_FORMAT, "expected an expression"},
        {"x\n\n  {{ 1 + }}", LMX_ERR_FORMAT, "line 3, column 10"},
        {"{% unknowntag %}", LMX_ERR_FORMAT, "unknown or unexpected tag"},
        {"{# never closed", LMX_ERR_FORMAT, "missing end of comment tag"},
        {"{{ x", LMX_ERR_FORMAT, "expected '}}'"},
        {"{% if x %}{% endfor %}", LMX_ERR_FORMAT, "unknown or unexpected tag"},
        {"{{ 99999999999999999999 }}", LMX_ERR_FORMAT, "integer literal too large"},
        {"{{ raise_exception('boom: ' ~ 42) }}", LMX_ERR_INVALID_ARG, "boom: 42"},
        {"{{ raise_exception('') }}", LMX_ERR_INVALID_ARG, "without a message"},
        {"{{ raise_exception() }}", LMX_ERR_INVALID_ARG, "without a message"},
        {"{{ u() }}", LMX_ERR_INVALID_ARG, "'u' is undefined"},
        {"a\n{{ u.attr }}", LMX_ERR_INVALID_ARG, "line 2: 'u' is undefined"},
        {"{{ {}.a.b }}", LMX_ERR_INVALID_ARG, "'dict object' has no attribute 'a'"},
        {"{{ 'a' + 1 }}", LMX_ERR_INVALID_ARG, "unsupported operand type(s) for +: 'str' and 'int'"},
        {"{{ 1 // 0 }}", LMX_ERR_INVALID_ARG, "by zero"},
        {"{{ [1,2].append(3) }}", LMX_ERR_INVALID_ARG, "unsafe"},
        {"{% set d = {} %}{% set d.a = 1 %}", LMX_ERR_INVALID_ARG, "non-namespace"},
        {"{{ u|tojson }}", LMX_ERR_INVALID_ARG, "not JSON serializable"},
        {"{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", LMX_ERR_INVALID_ARG, "too deep"},
        {"{% for i in range(100000000) %}{% endfor %}", LMX_ERR_INVALID_ARG, "range() longer than"},
        {"{% set r = range(3000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
         LMX_ERR_INVALID_ARG, "steps"},
        {"{% set s = 'x' * 1000000 %}{% for i in range(200) %}{{ s }}{% endfor %}",
         LMX_ERR_INVALID_ARG, "rendered text exceeds"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lmx_err err = {0};
        lmx_jinja *t = NULL;
        char *out = NULL;
        lmx_status s = lmx_jinja_parse(cases[i].tpl, strlen(cases[i].tpl), &t, &err);
        if (s == LMX_OK) s = lmx_jinja_render(t, NULL, &out, &err);
        CHECK_MSG(s == cases[i].status, "error case %zu %s: status %s (%s)", i, cases[i].tpl,
                  lmx_status_str(s), err.msg);
        CHECK_MSG(strstr(err.msg, cases[i].msg) != NULL, "error case %zu %s: message \"%s\" lacks \"%s\"",
                  i, cases[i].tpl, err.msg, cases[i].msg);
        CHECK(out == NULL);
        lmx_jinja_free(t);
    }
    /* misuse of the API */
    lmx_err err = {0};
    lmx_jinja *t = NULL;
    char *out = NULL;
    CHECK(lmx_jinja_parse(NULL, 0, &t, &err) == LMX_ERR_INVALID_ARG && t == NULL);
    CHECK(lmx_jinja_render(NULL, NULL, &out, &err) == LMX_ERR_INVALID_ARG && out == NULL);
    lmx_jinja_free(NULL);
    lmx_chat_template_free(NULL);
    lmx_chat_template *ct = NULL;
    CHECK(lmx_chat_template_builtin("qwen", &ct, &err) == LMX_OK);
    cJSON *obj = cJSON_CreateObject();
    CHECK(lmx_chat_template_render(ct, obj, 1, NULL, NULL, &out, &err) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "messages must be a JSON array");
    cJSON_Delete(obj);
    lmx_chat_template_free(ct);
    CHECK(lmx_chat_template_builtin("nosuchfamily", &ct, &err) == LMX_ERR_UNSUPPORTED && !ct);
}

/* ---- 5. loading, built-in formats, variables, the command ----------------------------------- */
static void put_file(const char *dir, const char *name, const char *text) {
    char *path = lmx_path_join(dir, name);
    FILE *fp = path ? fopen(path, "w") : NULL;
    CHECK_MSG(fp != NULL, "cannot create %s/%s", dir, name);
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
    free(path);
}

static void rm_file(const char *dir, const char *name) {
    char *path = lmx_path_join(dir, name);
    if (path) unlink(path);
    free(path);
}

/* Load path (family may be NULL), render messages with add_generation_prompt, compare. */
static void expect_render(const char *path, const char *family, const char *messages,
                          const char *want) {
    lmx_err err = {0};
    lmx_chat_template *t = NULL;
    lmx_status s = lmx_chat_template_load(path, family, &t, &err);
    CHECK_MSG(s == LMX_OK, "%s: %s", path, err.msg);
    if (!t) return;
    char *got = render_json(t, messages, 1, &err, &s);
    CHECK_MSG(s == LMX_OK, "%s: %s", path, err.msg);
    CHECK_MSG(got && !strcmp(got, want), "%s (%s):\n got: %s\nwant: %s", path,
              family ? family : "-", got ? got : "(null)", want);
    free(got);
    lmx_chat_template_free(t);
}

static void test_loading(void) {
    char dir[] = "/tmp/lmx_chat_template_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK_MSG(0, "mkdtemp failed");
        return;
    }
    const char *one = "[{\"role\":\"user\",\"content\":\"U\"}]";
    put_file(dir, "tokenizer_config.json",
             "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
             " \"pad_token\": null, \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
             " {\"name\": \"default\", \"template\": \"{{ bos_token }}D{{ messages|length }}"
             "{{ eos_token }}{{ pad_token is defined }}\"}]}");
    expect_render(dir, NULL, one, "<s>D1</s>False");
    put_file(dir, "chat_template.jinja", "J{{ bos_token }}{{ add_generation_prompt }}\n");
    expect_render(dir, NULL, one, "J<s>True");   /* chat_template.jinja wins */
    char *p = lmx_path_join(dir, "chat_template.jinja");
    expect_render(p, NULL, one, "J<s>True");
    free(p);
    p = lmx_path_join(dir, "tokenizer_config.json");
    expect_render(p, NULL, one, "<s>D1</s>False");
    free(p);
    rm_file(dir, "chat_template.jinja");

    /* no template: a family's built-in format, named or from config.json */
    put_file(dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    const char *conv = "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"},"
                       "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},"
                       "{\"type\":\"text\",\"text\":\"B\"}]}]";
    expect_render(dir, "gemma", conv,
                  "<start_of_turn>system\nS<end_of_turn>\n<start_of_turn>user\nU<end_of_turn>\n"
                  "<start_of_turn>model\nAB<end_of_turn>\n<start_of_turn>model\n");
    expect_render(dir, "qwen", conv,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                  "<|im_start|>assistant\nAB<|im_end|>\n<|im_start|>assistant\n");
    expect_render(dir, "llama3", conv,
                  "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nAB<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    put_file(dir, "config.json", "{\"model_type\": \"qwen3\"}");
    expect_render(dir, NULL, one, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    rm_file(dir, "config.json");

    lmx_err err = {0};
    lmx_chat_template *t = NULL;
    CHECK(lmx_chat_template_load(dir, NULL, &t, &err) == LMX_ERR_MISSING && !t);
    CHECK_CONTAINS(err.msg, "no chat template");
    CHECK(lmx_chat_template_load(dir, "nosuchfamily", &t, &err) == LMX_ERR_UNSUPPORTED && !t);
    put_file(dir, "tokenizer_config.json", "{\"chat_template\": ");
    CHECK(lmx_chat_template_load(dir, NULL, &t, &err) == LMX_ERR_FORMAT && !t);
    CHECK_CONTAINS(err.msg, "not valid JSON");
    put_file(dir, "tokenizer_config.json", "{\"chat_template\": 5}");
    CHECK(lmx_chat_template_load(dir, NULL, &t, &err) == LMX_ERR_FORMAT && !t);
    put_file(dir, "tokenizer_config.json", "{\"chat_template\": \"ok\\n{% if %}\"}");
    CHECK(lmx_chat_template_load(dir, NULL, &t, &err) == LMX_ERR_FORMAT && !t);
    CHECK_CONTAINS(err.msg, "tokenizer_config.json: chat_template: template syntax error at line 2");
    CHECK(lmx_chat_template_load("/nonexistent/lmx", NULL, &t, &err) == LMX_ERR_IO && !t);

    /* the variables transformers passes, kwargs overriding them */
    CHECK(lmx_chat_template_from_string(
              "{{ tools|tojson }}|{{ documents }}|{{ add_generation_prompt }}|{{ enable_thinking }}"
              "|{{ bos_token }}|{{ eos_token is defined }}",
              "<b>", NULL, &t, &err) == LMX_OK);
    cJSON *msgs = cJSON_Parse(one), *kw = cJSON_Parse("{\"enable_thinking\": false, \"bos_token\": \"X\"}");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"n\": 1.5}}]");
    char *out = NULL;
    CHECK(lmx_chat_template_render(t, msgs, 0, kw, tools, &out, &err) == LMX_OK);
    CHECK_MSG(out && !strcmp(out, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"n\": 1.5}}]"
                                  "|None|False|False|X|False"), "got %s", out ? out : "(null)");
    CHECK_MSG(!strcmp(lmx_chat_template_source(t), "{{ tools|tojson }}|{{ documents }}|{{ add_generation_prompt }}|"
                                                   "{{ enable_thinking }}|{{ bos_token }}|{{ eos_token is defined }}"),
              "source");
    free(out);
    cJSON_Delete(msgs);
    cJSON_Delete(kw);
    cJSON_Delete(tools);
    lmx_chat_template_free(t);

    /* the command, when the test runs under ctest */
    const char *bin = getenv("LMX_BIN");
    if (bin && *bin && access(bin, X_OK) != 0)
        fprintf(stderr, "note: %s is not built; `lmx template` not tested\n", bin);
    else if (bin && *bin) {
        put_file(dir, "tokenizer_config.json",
                 "{\"bos_token\": \"<s>\", \"chat_template\": \"{{ bos_token }}{% for m in messages %}"
                 "{{ m.role }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}>{% endif %}"
                 "{{ raise_exception('no') if messages|length > 1 }}\"}");
        put_file(dir, "in.jsonl",
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"h\\u00e9 \\\"q\\\"\"}], "
                 "\"add_generation_prompt\": true, \"kwargs\": {}}\n\n"
                 "not json\n"
                 "{\"messages\": [{\"role\": \"a\", \"content\": \"1\"}, {\"role\": \"b\", \"content\": \"2\"}]}\n");
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "\"%s\" template \"%s\" < \"%s/in.jsonl\" > \"%s/out.jsonl\"", bin, dir, dir, dir);
        CHECK(system(cmd) == 0);
        char *path = lmx_path_join(dir, "out.jsonl"), *text = NULL;
        size_t n = 0;
        CHECK(lmx_read_file(path, &text, &n, &err) == LMX_OK);
        const char *want = "{\"text\":\"<s>user:h\xc3\xa9 \\\"q\\\";>\"}\n"
                           "{\"error\":\"input line 3: not a JSON object\"}\n"
                           "{\"error\":\"no\"}\n";
        CHECK_MSG(text && !strcmp(text, want), "lmx template output:\n%s", text ? text : "(null)");
        free(text);
        free(path);
        snprintf(cmd, sizeof cmd, "\"%s\" template --help > /dev/null", bin);
        CHECK(system(cmd) == 0);
        snprintf(cmd, sizeof cmd, "\"%s\" template 2> /dev/null", bin);
        int rc = system(cmd);
        CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
        snprintf(cmd, sizeof cmd, "\"%s\" template \"%s\" --bogus 2> /dev/null", bin, dir);
        rc = system(cmd);
        CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2);
        rm_file(dir, "in.jsonl");
        rm_file(dir, "out.jsonl");
    }
    rm_file(dir, "tokenizer_config.json");
    CHECK(rmdir(dir) == 0);
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : getenv("LMX_FIXTURES");
    if (!fixtures) fixtures = "../shared/fixtures";
    test_fixture(fixtures, "qwen3");
    test_fixture(fixtures, "llama3");
    test_fixture(fixtures, "gemma3");
    test_gemma_270m(fixtures);
    test_engine_table();
    test_errors();
    test_loading();
    return check_summary("test_chat_template");
}
