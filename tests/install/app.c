/* app.c - a program that uses the installed lmx as any consumer would: built by
 * tests/install_check.sh against liblmx.so and liblmx.a, once through pkg-config and once through
 * find_package(lmx).  It chats one greedy turn with a model on the cpu and prints the reply.
 * usage: app MODEL MESSAGE */
#include <lmx.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: app MODEL MESSAGE\n");
        return 2;
    }
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    lmx_model *m = NULL;
    if (lmx_model_load(argv[1], &lp, &m) != LMX_OK) {
        fprintf(stderr, "app: %s\n", lmx_last_error(NULL));
        return 1;
    }
    lmx_gen_params gp = lmx_gen_default_params();
    gp.max_tokens = 8;
    gp.sampler.temperature = 0;
    lmx_message msg = {"user", argv[2]};
    lmx_result r;
    lmx_status s = lmx_chat(m, &msg, 1, &gp, &r);
    if (s != LMX_OK || r.n_ids == 0) {
        fprintf(stderr, "app: chat: %s: %s\n", lmx_status_str(s), lmx_last_error(m));
        lmx_model_free(m);
        return 1;
    }
    printf("%s\n", r.text);
    lmx_model_free(m);
    return 0;
}
