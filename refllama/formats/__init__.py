"""Files as refllama reads them: GGUF and HF model files, ggml's type ids, tokenizers and chat templates, and the
checks that make a model file safe to read (bounded JSON, regular files, memory before it is allocated)."""
