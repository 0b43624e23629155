"""Translation: WMT14 EN-DE / EN-FR as in the paper, or any parallel text corpus.

Modules: `task` (the Task and its config), `tokenizer` (byte-level BPE / word-piece with exact
detokenisation), `metrics` (sacreBLEU, the paper's tokenised BLEU, chrF), `moses` (the word
tokeniser and compound splitting behind tokenised BLEU), `languages` (the ISO 639-1 codes
src_lang / tgt_lang may take). Recipes live in `data_recipes`.
"""

from .task import TranslationConfig, TranslationTask

__all__ = ["TranslationConfig", "TranslationTask"]
