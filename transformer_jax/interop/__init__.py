"""The formats other tools read and write: CTranslate2 (export and serving) and transformers' MarianMT (export,
import, model card)."""
