"""Tiny configs of transformers architectures, built locally: random weights, no download.

Each entry names transformers' own config and base-model classes and the few config
fields that make it tiny (2 layers, width 32, 4 heads, vocab 128) while keeping what
makes the architecture itself: its position scheme, grouped K/V heads, partial rotary,
parallel blocks. ``build(name)`` returns the model in eval mode, seeded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

V, D, H, LAYERS, FF, MAX_POS = 128, 32, 4, 2, 64, 1024


@dataclass(frozen=True)
class Arch:
    config: str  # transformers config class
    model: str  # transformers base-model class
    positions: str  # rotary | alibi | relative | learned | sinusoidal
    options: dict = field(default_factory=dict)
    decoder: bool = False  # causal LM body with a KV cache

    def build(self):
        import torch  # pylint: disable=import-outside-toplevel
        import transformers  # pylint: disable=import-outside-toplevel
        config = getattr(transformers, self.config)(**self.options)
        torch.manual_seed(0)
        model = getattr(transformers, self.model)(config).eval()
        return model


def _decoder(**extra):
    base = dict(vocab_size=V, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS,
                num_attention_heads=H, max_position_embeddings=MAX_POS, bos_token_id=0, eos_token_id=1,
                pad_token_id=2)
    return {**base, **extra}


def _bert_like(**extra):
    base = dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H,
                intermediate_size=FF, max_position_embeddings=MAX_POS, pad_token_id=0)
    return {**base, **extra}


ARCHITECTURES = {
    # the list
    "llama": Arch("LlamaConfig", "LlamaModel", "rotary", _decoder(num_key_value_heads=2), decoder=True),
    "gpt_neox": Arch("GPTNeoXConfig", "GPTNeoXModel", "rotary", _decoder(rotary_pct=0.5), decoder=True),
    "gptj": Arch("GPTJConfig", "GPTJModel", "rotary",
                 dict(vocab_size=V, n_embd=D, n_layer=LAYERS, n_head=H, rotary_dim=4, n_positions=MAX_POS,
                      bos_token_id=0, eos_token_id=1), decoder=True),
    "falcon_rotary": Arch("FalconConfig", "FalconModel", "rotary",
                          dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H,
                               alibi=False, new_decoder_architecture=True, num_kv_heads=2,
                               bos_token_id=0, eos_token_id=1), decoder=True),
    "falcon_alibi": Arch("FalconConfig", "FalconModel", "alibi",
                         dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H,
                              alibi=True, bos_token_id=0, eos_token_id=1), decoder=True),
    "bloom": Arch("BloomConfig", "BloomModel", "alibi",
                  dict(vocab_size=V, hidden_size=D, n_layer=LAYERS, n_head=H, bos_token_id=0, eos_token_id=1),
                  decoder=True),
    "mpt": Arch("MptConfig", "MptModel", "alibi",
                dict(vocab_size=V, d_model=D, n_layers=LAYERS, n_heads=H, max_seq_len=MAX_POS), decoder=True),
    "t5_encoder": Arch("T5Config", "T5EncoderModel", "relative",
                       dict(vocab_size=V, d_model=D, d_kv=8, d_ff=FF, num_layers=LAYERS, num_heads=H)),
    "bert": Arch("BertConfig", "BertModel", "learned", _bert_like()),
    "roformer": Arch("RoFormerConfig", "RoFormerModel", "rotary", _bert_like()),
    # other architectures with rotary, ALiBi, relative-bias or learned positions
    "qwen2": Arch("Qwen2Config", "Qwen2Model", "rotary", _decoder(num_key_value_heads=2), decoder=True),
    "qwen3": Arch("Qwen3Config", "Qwen3Model", "rotary", _decoder(num_key_value_heads=2, head_dim=8),
                  decoder=True),
    # a window shorter than the unseen lengths 37 and 100, so that its mask matters there (and
    # longer than the 33 tokens the compile checks a KV-cache graph at: past = 33 < window)
    "mistral": Arch("MistralConfig", "MistralModel", "rotary", _decoder(num_key_value_heads=2, sliding_window=36),
                    decoder=True),
    "phi": Arch("PhiConfig", "PhiModel", "rotary", _decoder(partial_rotary_factor=0.5), decoder=True),
    "phi3": Arch("Phi3Config", "Phi3Model", "rotary", _decoder(num_key_value_heads=2), decoder=True),
    "gemma": Arch("GemmaConfig", "GemmaModel", "rotary", _decoder(num_key_value_heads=1, head_dim=8),
                  decoder=True),
    "gemma2": Arch("Gemma2Config", "Gemma2Model", "rotary",
                   _decoder(num_key_value_heads=2, head_dim=8, sliding_window=64), decoder=True),
    "stablelm": Arch("StableLmConfig", "StableLmModel", "rotary", _decoder(num_key_value_heads=2),
                     decoder=True),
    "olmo": Arch("OlmoConfig", "OlmoModel", "rotary", _decoder(), decoder=True),
    "granite": Arch("GraniteConfig", "GraniteModel", "rotary", _decoder(num_key_value_heads=2), decoder=True),
    "starcoder2": Arch("Starcoder2Config", "Starcoder2Model", "rotary", _decoder(num_key_value_heads=2),
                       decoder=True),
    "codegen": Arch("CodeGenConfig", "CodeGenModel", "rotary",
                    dict(vocab_size=V, n_embd=D, n_layer=LAYERS, n_head=H, rotary_dim=4, n_positions=MAX_POS,
                         n_ctx=MAX_POS, bos_token_id=0, eos_token_id=1), decoder=True),
    "gpt2": Arch("GPT2Config", "GPT2Model", "learned",
                 dict(vocab_size=V, n_embd=D, n_layer=LAYERS, n_head=H, n_positions=MAX_POS,
                      bos_token_id=0, eos_token_id=1), decoder=True),
    "gpt_bigcode": Arch("GPTBigCodeConfig", "GPTBigCodeModel", "learned",
                        dict(vocab_size=V, n_embd=D, n_layer=LAYERS, n_head=H, n_positions=MAX_POS,
                             bos_token_id=0, eos_token_id=1), decoder=True),
    "opt": Arch("OPTConfig", "OPTModel", "learned",
                dict(vocab_size=V, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=H, ffn_dim=FF,
                     max_position_embeddings=MAX_POS, word_embed_proj_dim=D, bos_token_id=0, eos_token_id=1,
                     pad_token_id=2), decoder=True),
    "roberta": Arch("RobertaConfig", "RobertaModel", "learned", _bert_like(max_position_embeddings=MAX_POS + 2,
                                                                           pad_token_id=1)),
    "electra": Arch("ElectraConfig", "ElectraModel", "learned", _bert_like(embedding_size=D)),
    "distilbert": Arch("DistilBertConfig", "DistilBertModel", "learned",
                       dict(vocab_size=V, dim=D, n_layers=LAYERS, n_heads=H, hidden_dim=FF,
                            max_position_embeddings=MAX_POS, pad_token_id=0)),
    "deberta_v2": Arch("DebertaV2Config", "DebertaV2Model", "relative",
                       _bert_like(relative_attention=True, position_buckets=32, max_relative_positions=64,
                                  pos_att_type=["p2c", "c2p"], position_biased_input=False)),
    "mpnet": Arch("MPNetConfig", "MPNetModel", "relative", _bert_like(max_position_embeddings=MAX_POS + 2,
                                                                      pad_token_id=1)),
    "esm": Arch("EsmConfig", "EsmModel", "rotary",
                _bert_like(position_embedding_type="rotary", mask_token_id=3, pad_token_id=1)),
}


def build(name: str):
    """transformers' model for the tiny config ``name``, eval mode, seeded weights."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name].build()
