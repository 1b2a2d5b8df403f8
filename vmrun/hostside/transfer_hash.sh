# sh -c THIS transfer-hash < "path\0path\0..." (vmrun.transfer.manifest): one SHA-256 line
# per readable file, in order; openssl (SHA-NI, ~6x faster) when the host has it.
if command -v openssl >/dev/null 2>&1; then exec xargs -0 openssl dgst -sha256 -r
fi
exec xargs -0 sha256sum -b
