# sh -c THIS transfer-drop DIR < "path\0path\0..." (vmrun.transfer.upload): remove the
# temporary copies that failed verification.
cd -- "$1" && exec xargs -0 rm -f --
