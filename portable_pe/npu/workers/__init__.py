"""Worker scripts run by vendor toolchains' own interpreters (npu/toolchain.py's contract).

Each is a standalone script that imports nothing of portable-pe; this folder holds only
them, so a worker's own folder on its sys.path shadows nothing a toolchain imports (a
module named rknn.py next to a worker would hide the RKNN package).
"""
