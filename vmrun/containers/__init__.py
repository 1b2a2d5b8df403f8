"""Training inside a container image: the image and its mounts (`image`), the runtimes as
values with the argv each needs (`runtime`), reading an image pull (`pull`), and naming a
runtime's refusal to start a run's container (`refusals`).

Nothing here touches a host: the backends build commands from these values and run them
(the host side is vmrun/hostside/container_run.sh). docs/containers.md says how it fits.
"""
