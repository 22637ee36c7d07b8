"""tokencredit's stages and algorithms: sample -> verify -> credit -> write -> train."""
import os

# MKL may run a matmul on fewer threads than asked when the machine is busy, which changes the
# last bits of every log-prob and so the dataset's bytes; a fixed thread count keeps a run
# reproducible (it is read when MKL first runs, so before torch does any work).
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
