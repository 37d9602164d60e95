"""Byte-level token shards for the gpt tests: the first 400,000 bytes of a text, 9/10 as a train
shard and the rest as a val shard, in llm.c's .bin format (a 256 x int32 header: magic 20240520,
version 1, token count; then uint16 tokens, here the bytes themselves: vocabulary 256).
  python3 tests/write_byte_shards.py TEXT_FILE OUT_DIR
"""
import struct
import sys

data = open(sys.argv[1], "rb").read()[:400_000]
cut = len(data) * 9 // 10
for name, part in (("smoke_train_000000.bin", data[:cut]), ("smoke_val_000000.bin", data[cut:])):
    with open(f"{sys.argv[2]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
        f.write(struct.pack(f"<{len(part)}H", *part))
