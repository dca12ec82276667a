/* llama.cpp's logits for every position of one prompt, in one batch, as tools/dump_llamacpp.py asks for them
 * (flash attention off, float16 KV cache, the CPU repack on): a plain C program, so that a llama.cpp cross-built
 * for another CPU (tools/build_llamacpp_arm.sh) runs it under qemu-user where no Python of that CPU is at hand.
 *
 *   llamacpp_logits MODEL.gguf N_CTX ID,ID,... OUT.f32 [--no-repack]
 *     -> OUT.f32: float32 [n_ids, n_vocab], rows in order; stdout: llama_print_system_info().
 *     --no-repack: the CPU repack off (use_extra_bufts, llama-cli's --no-repack)
 *   LLAMACPP_STAGES=DIR: also every named float32 tensor of the graph as DIR/NAME.f32 (its data in ggml's order), to
 *     find the first stage where an emulation parts from this build
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "llama.h"

static const char * stages;  // LLAMACPP_STAGES

static bool stage(struct ggml_tensor * t, bool ask, void * user) {
    (void) user;
    if (ask) return true;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || !t->name[0]) return true;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.f32", stages, t->name);
    FILE * f = fopen(path, "wb");
    if (f) fwrite(t->data, 1, ggml_nbytes(t), f), fclose(f);
    return true;
}

static void quiet(enum ggml_log_level level, const char * text, void * user) { (void) level; (void) text; (void) user; }

int main(int argc, char ** argv) {
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "--no-repack") == 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf N_CTX ID,ID,... OUT.f32 [--no-repack]\n", argv[0]);
        return 2;
    }
    int n_ids = 1;
    for (const char * c = argv[3]; *c; c++) n_ids += *c == ',';
    llama_token * ids = malloc(sizeof(llama_token) * n_ids);
    char * rest = argv[3];
    for (int i = 0; i < n_ids; i++) ids[i] = (llama_token) strtol(rest, &rest, 10), rest += *rest == ',';

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = argc == 5;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) atoi(argv[2]);
    cp.n_batch = cp.n_ubatch = (uint32_t) n_ids;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if ((stages = getenv("LLAMACPP_STAGES"))) cp.cb_eval = stage, cp.cb_eval_user_data = NULL;
    struct llama_context * ctx = llama_init_from_model(model, cp);

    struct llama_batch batch = llama_batch_init(n_ids, 0, 1);
    batch.n_tokens = n_ids;
    for (int i = 0; i < n_ids; i++) {
        batch.token[i] = ids[i], batch.pos[i] = i, batch.n_seq_id[i] = 1, batch.seq_id[i][0] = 0, batch.logits[i] = 1;
    }
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * out = fopen(argv[4], "wb");
    for (int i = 0; i < n_ids; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    fclose(out);
    printf("%s\n", llama_print_system_info());
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
