"""``thor_bert`` pipeline: text corpus -> tokenizer -> pre-training examples -> BERT -> THOR and its first-order
baseline -> held-out masked-LM evaluation."""
