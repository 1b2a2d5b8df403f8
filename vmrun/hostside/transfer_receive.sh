# sh -c THIS transfer-receive DIR < TAR (vmrun.transfer.upload): unpack the stream under
# DIR, keeping the sender's mtimes.
mkdir -p -- "$1" && cd -- "$1" && exec tar -x -f - --no-same-owner
