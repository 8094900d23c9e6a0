from .wordpiece import SPECIALS, WordPieceBPE, fairseq_symbols, load_wordpiece, vocabulary

__all__ = ["SPECIALS", "WordPieceBPE", "fairseq_symbols", "load_wordpiece", "vocabulary"]
