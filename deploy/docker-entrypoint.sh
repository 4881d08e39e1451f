#!/bin/sh
# Starts the adaps executable named by ADAPS_ROLE (scheduler, server or worker). Its flags
# come from, weakest first: the training recipe (ADAPS_RECIPE, default the image's copy of
# deploy/recipe.flags; "none" for no recipe), ADAPS_<FLAG> environment variables, a config
# file (ADAPS_CONFIG), the container's command arguments. The recipe's flags for the role
# become ADAPS_<FLAG> variables unless the environment sets them already.
set -ef  # -f: no globbing of the recipe's words
me=adaps-entrypoint
case "${ADAPS_ROLE:-}" in
  scheduler|server|worker) ;;
  *) echo "$me: set ADAPS_ROLE to scheduler, server or worker" >&2; exit 2 ;;
esac
recipe=${ADAPS_RECIPE:-/opt/adaps/share/adaps/recipe.flags}
if [ "$recipe" != none ]; then
  [ -r "$recipe" ] || { echo "$me: cannot read the recipe $recipe (ADAPS_RECIPE)" >&2; exit 2; }
  applied="" kept=""
  for flag in $(sed -n "s/^$ADAPS_ROLE:[[:space:]]*//p" "$recipe"); do
    case "$flag" in
      --*=*) name=${flag%%=*} value=${flag#*=} ;;
      --*) name=$flag value=true ;;
      *) echo "$me: $recipe: '$flag' is not a --flag" >&2; exit 2 ;;
    esac
    name=${name#--}
    case "$name" in
      ""|*[!a-z0-9_]*) echo "$me: $recipe: bad flag name '$name'" >&2; exit 2 ;;
    esac
    var=ADAPS_$(echo "$name" | tr "[:lower:]" "[:upper:]")
    if eval "[ -n \"\${$var+set}\" ]"; then
      kept="$kept $var"
    else
      export "$var=$value"
      applied="$applied $var=$value"
    fi
  done
  echo "$me: $ADAPS_ROLE recipe from $recipe:${applied:- nothing}${kept:+ (kept from the environment:$kept)}" >&2
fi
exec "adaps-${ADAPS_ROLE}" "$@"
