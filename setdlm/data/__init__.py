"""Data: tokenizers, text corpora and the batches models train on.

Modules: ``tokenizers`` (load a published tokenizer, train a tiny byte-level BPE), ``text``
(WikiText-2 documents, the chunked LM dataset) and ``loader`` (a resumable, deterministic
stream of batches). Import from the modules; this package imports nothing heavy on its own.
"""
