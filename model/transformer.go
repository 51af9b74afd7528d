package model

import "fmt"

// Sequence zoo models: per-worker batch seqBatch sequences of seqLen tokens
// (for the encoder-decoder Transformer, seqLen source and seqLen target
// tokens). Embeddings are layer 0; each block is split into an attention
// Layer (with its LayerNorm) and a feed-forward Layer (with its LayerNorm).
// The attention cost includes the Q·Kᵀ and weights·V matmuls; softmax,
// LayerNorm, activations and residual additions are neglected. An embedding
// lookup is charged 1 FLOP per output element so that its time is tiny but
// not zero. A tied output projection (LM head) has no tensor of its own: its
// FLOPs are charged to the last Layer.

const (
	seqBatch = 32
	seqLen   = 128
)

// attnProj is the four d×d projections (with bias) of multi-head attention,
// named as in fairseq's MultiheadAttention.
func attnProj(pre string, d int) []Tensor {
	var ts []Tensor
	for _, p := range []string{"q_proj", "k_proj", "v_proj", "out_proj"} {
		ts = append(ts, linear(pre+"."+p, d, d, true)...)
	}
	return ts
}

// transformerBase is the Transformer base model of Vaswani et al. (2017) for
// WMT'14 English-German in fairseq's post-norm transformer_wmt_en_de layout:
// d_model 512, 8 heads, FFN 2048, 6 encoder and 6 decoder layers, sinusoidal
// positions (no parameters), and one embedding matrix of the 37000-token
// shared source-target BPE vocabulary shared by the encoder input, decoder
// input and pre-softmax projection (no output bias).
func transformerBase() *Profile {
	const (
		d      = 512
		ffn    = 2048
		layers = 6
		vocab  = 37000
		n      = seqLen
	)
	b := newBuilder("transformer", seqBatch)
	b.add("embed_tokens", float64(d*2*n), embedding("embed_tokens.weight", vocab, d))
	selfAttn := 4*linearFLOPs(d, d, n) + attnFLOPs(n, n, d)
	ffnFLOPs := linearFLOPs(d, ffn, n) + linearFLOPs(ffn, d, n)
	for i := 0; i < layers; i++ {
		pre := fmt.Sprintf("encoder.layers.%d", i)
		b.add(pre+".self_attn", selfAttn, attnProj(pre+".self_attn", d), norm(pre+".self_attn_layer_norm", d))
		b.add(pre+".ffn", ffnFLOPs,
			linear(pre+".fc1", d, ffn, true), linear(pre+".fc2", ffn, d, true), norm(pre+".final_layer_norm", d))
	}
	// Cross-attention: queries from n target tokens, keys and values from n
	// source tokens.
	crossAttn := 2*linearFLOPs(d, d, n) + 2*linearFLOPs(d, d, n) + attnFLOPs(n, n, d)
	for i := 0; i < layers; i++ {
		pre := fmt.Sprintf("decoder.layers.%d", i)
		b.add(pre+".self_attn", selfAttn, attnProj(pre+".self_attn", d), norm(pre+".self_attn_layer_norm", d))
		b.add(pre+".encoder_attn", crossAttn, attnProj(pre+".encoder_attn", d), norm(pre+".encoder_attn_layer_norm", d))
		b.add(pre+".ffn", ffnFLOPs,
			linear(pre+".fc1", d, ffn, true), linear(pre+".fc2", ffn, d, true), norm(pre+".final_layer_norm", d))
	}
	b.addFLOPs(linearFLOPs(d, vocab, n)) // tied output projection
	return b.build()
}

// bertBase is bert-base-uncased as HuggingFace BertModel, pooler included and
// no task head: vocabulary 30522, 512 positions, 2 token types, hidden 768,
// 12 layers, 12 heads, intermediate 3072.
func bertBase() *Profile {
	const (
		d      = 768
		inter  = 3072
		layers = 12
		n      = seqLen
	)
	b := newBuilder("bert-base", seqBatch)
	b.add("embeddings", float64(3*d*n),
		embedding("embeddings.word_embeddings.weight", 30522, d),
		embedding("embeddings.position_embeddings.weight", 512, d),
		embedding("embeddings.token_type_embeddings.weight", 2, d),
		norm("embeddings.LayerNorm", d))
	for i := 0; i < layers; i++ {
		pre := fmt.Sprintf("encoder.layer.%d", i)
		b.add(pre+".attention", 4*linearFLOPs(d, d, n)+attnFLOPs(n, n, d),
			linear(pre+".attention.self.query", d, d, true),
			linear(pre+".attention.self.key", d, d, true),
			linear(pre+".attention.self.value", d, d, true),
			linear(pre+".attention.output.dense", d, d, true),
			norm(pre+".attention.output.LayerNorm", d))
		b.add(pre+".ffn", linearFLOPs(d, inter, n)+linearFLOPs(inter, d, n),
			linear(pre+".intermediate.dense", d, inter, true),
			linear(pre+".output.dense", inter, d, true),
			norm(pre+".output.LayerNorm", d))
	}
	// The pooler transforms the first ([CLS]) token only.
	b.add("pooler", linearFLOPs(d, d, 1), linear("pooler.dense", d, d, true))
	return b.build()
}

// gpt2Small is GPT-2 small as HuggingFace GPT2Model (pre-norm blocks, Conv1D
// projections with bias): vocabulary 50257, 1024 positions, d 768, 12 layers,
// 12 heads. The LM head is tied to wte, so it adds FLOPs (charged to ln_f)
// but no parameters.
func gpt2Small() *Profile {
	const (
		d      = 768
		layers = 12
		vocab  = 50257
		n      = seqLen
	)
	b := newBuilder("gpt2", seqBatch)
	b.add("embeddings", float64(2*d*n), embedding("wte.weight", vocab, d), embedding("wpe.weight", 1024, d))
	for i := 0; i < layers; i++ {
		pre := fmt.Sprintf("h.%d", i)
		b.add(pre+".attn", linearFLOPs(d, 3*d, n)+linearFLOPs(d, d, n)+attnFLOPs(n, n, d),
			norm(pre+".ln_1", d),
			linear(pre+".attn.c_attn", d, 3*d, true),
			linear(pre+".attn.c_proj", d, d, true))
		b.add(pre+".mlp", linearFLOPs(d, 4*d, n)+linearFLOPs(4*d, d, n),
			norm(pre+".ln_2", d),
			linear(pre+".mlp.c_fc", d, 4*d, true),
			linear(pre+".mlp.c_proj", 4*d, d, true))
	}
	b.add("ln_f", linearFLOPs(d, vocab, n), norm("ln_f", d)) // plus the tied LM head
	return b.build()
}
