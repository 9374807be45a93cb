"""Loading a model: a checkpoint's config read by its family's reader, its weights under the family's
names, its tokenizer and EOS ids, or a random preset's weights (the room above ``families`` and
``models``)."""
