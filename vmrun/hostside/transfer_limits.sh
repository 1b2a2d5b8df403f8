# sh THIS (vmrun.transfer.streams.plan_streams): the smallest MaxStartups (its first number)
# and MaxSessions any readable sshd configuration file sets, or the defaults (10, 10).
# Without root `sshd -T` cannot run; a Match block's value counts too (the safe side).
startups=10 sessions=10
for file in /etc/ssh/sshd_config /etc/ssh/sshd_config.d/*.conf; do
    [ -r "$file" ] || continue
    while read -r key value _rest; do
        case $key in
            [Mm][Aa][Xx][Ss][Tt][Aa][Rr][Tt][Uu][Pp][Ss])
                value=${value%%:*}
                case $value in '' | *[!0-9]*) ;; *) [ "$value" -lt "$startups" ] && startups=$value ;; esac ;;
            [Mm][Aa][Xx][Ss][Ee][Ss][Ss][Ii][Oo][Nn][Ss])
                case $value in '' | *[!0-9]*) ;; *) [ "$value" -lt "$sessions" ] && sessions=$value ;; esac ;;
        esac
    done < "$file"
done
echo "$startups $sessions"
