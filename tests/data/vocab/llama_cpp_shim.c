// A vocabulary-only loader over libllama, for record_llama_cpp.py (ctypes cannot build
// llama_model_params portably, so this sets vocab_only and hands back the vocab).
#include "llama.h"

#include <stddef.h>

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) level;
    (void) text;
    (void) user;
}

const struct llama_vocab * shim_load_vocab(const char * path, struct llama_model ** model_out) {
    llama_log_set(quiet, NULL);
    struct llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(path, params);
    *model_out = model;
    return model ? llama_model_get_vocab(model) : NULL;
}
