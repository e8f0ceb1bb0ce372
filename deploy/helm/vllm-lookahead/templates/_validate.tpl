{{/*
Values checks the schema cannot express, run before anything renders (server.yaml includes this).

Every rule here is one the Kubernetes API server (or the pod's runtime) applies later; checked here, a
bad value fails `helm install/template/lint` at once with the fix, instead of a half-applied release
or a Deployment whose pods never schedule.  All problems are collected and reported together.
The helm_cluster test tier (tests/helm_cluster) found the first four on a real API server that the
schema and kubeconform both accepted.
*/}}

{{/* Label key: optional DNS-subdomain prefix (<=253) + "/" + name (<=63); as the API server's IsQualifiedName. */}}
{{- define "vllm-lookahead.isQualifiedName" -}}
{{- $k := toString . -}}
{{- $parts := splitList "/" $k -}}
{{- $name := last $parts -}}
{{- $ok := and (le (len $parts) 2) (le (len $name) 63) (regexMatch "^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" $name) -}}
{{- if eq (len $parts) 2 -}}
{{- $prefix := first $parts -}}
{{- $ok = and $ok (le (len $prefix) 253) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $prefix) -}}
{{- end -}}
{{- if $ok -}}true{{- end -}}
{{- end -}}

{{/* Label value: empty, or <=63 chars of [A-Za-z0-9-_.] starting and ending alphanumeric. */}}
{{- define "vllm-lookahead.isLabelValue" -}}
{{- $v := toString . -}}
{{- if and (le (len $v) 63) (regexMatch "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$" $v) -}}true{{- end -}}
{{- end -}}

{{/*
A Kubernetes quantity in base units (bytes, cores) as a decimal string, or "" when it is not one.
Exponent forms ("1e3") are rare in charts and returned as "" too - and then not compared.
*/}}
{{- define "vllm-lookahead.quantityValue" -}}
{{- $q := toString . -}}
{{- $re := "^([0-9]+\\.?[0-9]*|\\.[0-9]+)(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$" -}}
{{- if regexMatch $re $q -}}
{{- $num := float64 (regexReplaceAll $re $q "${1}") -}}
{{- $suffix := regexReplaceAll $re $q "${2}" -}}
{{- $mult := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- mulf $num (get $mult $suffix) -}}
{{- end -}}
{{- end -}}

{{/* Effective server replicas: the HPA's minimum when it owns the count. */}}
{{- define "vllm-lookahead.serverReplicas" -}}
{{- if .Values.hpa.enabled -}}{{ int .Values.hpa.minReplicas }}{{- else -}}{{ int .Values.server.replicaCount }}{{- end -}}
{{- end -}}

{{/* Integer value of a --flag=N or "--flag N" in a list of args; the default when absent. */}}
{{- define "vllm-lookahead.intArg" -}}
{{- $found := .default -}}
{{- $prev := "" -}}
{{- range .args -}}
{{- $a := toString . -}}
{{- range $.flags -}}
{{- if hasPrefix (printf "%s=" .) $a -}}{{- $found = trimPrefix (printf "%s=" .) $a -}}{{- end -}}
{{- if eq $prev . -}}{{- $found = $a -}}{{- end -}}
{{- end -}}
{{- $prev = $a -}}
{{- end -}}
{{- $found -}}
{{- end -}}

{{- define "vllm-lookahead.validate" -}}
{{- $v := .Values -}}
{{- $s := $v.server -}}
{{- $errs := list -}}

{{- /* Settings that need a Secret or a name. */}}
{{- if and (include "vllm-lookahead.kafkaUsesSASL" .) (not $v.kafka.sasl.existingSecret) -}}
{{- $errs = append $errs (printf "kafka.securityProtocol=%s needs kafka.sasl.existingSecret: create a Secret with keys %q and %q (kubectl create secret generic kafka-sasl --from-literal=%s=... --from-literal=%s=...) and set kafka.sasl.existingSecret to its name; credentials are never inlined in values" $v.kafka.securityProtocol $v.kafka.sasl.usernameKey $v.kafka.sasl.passwordKey $v.kafka.sasl.usernameKey $v.kafka.sasl.passwordKey) -}}
{{- end -}}
{{- if and (eq $s.modelCache.type "existingClaim") (not $s.modelCache.existingClaim) -}}
{{- $errs = append $errs "server.modelCache.type=existingClaim needs server.modelCache.existingClaim (the PVC name)" -}}
{{- end -}}
{{- if and $v.hpa.enabled (lt (int $v.hpa.maxReplicas) (int $v.hpa.minReplicas)) -}}
{{- $errs = append $errs (printf "hpa.maxReplicas (%d) must be >= hpa.minReplicas (%d)" (int $v.hpa.maxReplicas) (int $v.hpa.minReplicas)) -}}
{{- end -}}

{{- /* Ports: the API server rejects a NetworkPolicy or container port outside 1-65535. */}}
{{- range $i, $b := $v.kafka.bootstrapServers -}}
{{- $port := int (last (splitList ":" $b)) -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- $errs = append $errs (printf "kafka.bootstrapServers[%d]=%s: port %d is outside 1-65535 (the sidecar NetworkPolicy opens this port, and the API server rejects it)" $i $b $port) -}}
{{- end -}}
{{- end -}}
{{- $otlpPort := int (include "vllm-lookahead.otlpPort" .) -}}
{{- if or (lt $otlpPort 1) (gt $otlpPort 65535) -}}
{{- $errs = append $errs (printf "telemetry.otel.endpoint=%s: port %d is outside 1-65535" $v.telemetry.otel.endpoint $otlpPort) -}}
{{- end -}}

{{- /* Probes: Kubernetes requires successThreshold 1 on liveness and startup probes. */}}
{{- range $path, $probe := dict "server.probes.startup" $s.probes.startup "server.probes.liveness" $s.probes.liveness "sidecar.probes.liveness" $v.sidecar.probes.liveness -}}
{{- if and $probe (hasKey $probe "successThreshold") (ne (int $probe.successThreshold) 1) -}}
{{- $errs = append $errs (printf "%s.successThreshold=%d: Kubernetes requires 1 for liveness and startup probes (only a readiness probe may ask for several successes)" $path (int $probe.successThreshold)) -}}
{{- end -}}
{{- end -}}

{{- /* Labels, node selectors and annotation keys: the API server's syntax rules. */}}
{{- $labelMaps := dict "commonLabels" $v.commonLabels "server.podLabels" $s.podLabels "server.nodeSelector" $s.nodeSelector "sidecar.nodeSelector" $v.sidecar.nodeSelector "monitoring.serviceMonitor.labels" $v.monitoring.serviceMonitor.labels "monitoring.podMonitor.labels" $v.monitoring.podMonitor.labels "monitoring.prometheusRule.labels" $v.monitoring.prometheusRule.labels "monitoring.grafanaDashboard.labels" $v.monitoring.grafanaDashboard.labels -}}
{{- range $path := keys $labelMaps | sortAlpha -}}
{{- range $k, $val := (get $labelMaps $path) -}}
{{- if not (include "vllm-lookahead.isQualifiedName" $k) -}}
{{- $errs = append $errs (printf "%s: key %q is not a valid label key (optional DNS prefix + \"/\" + up to 63 characters of letters, digits, '-', '_', '.', starting and ending with a letter or digit)" $path $k) -}}
{{- end -}}
{{- if not (include "vllm-lookahead.isLabelValue" $val) -}}
{{- $errs = append $errs (printf "%s.%s=%q is not a valid label value (up to 63 characters of letters, digits, '-', '_', '.', starting and ending with a letter or digit; no spaces)" $path $k (toString $val)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $annotationMaps := dict "server.podAnnotations" $s.podAnnotations "server.service.annotations" $s.service.annotations "sidecar.podAnnotations" $v.sidecar.podAnnotations "serviceAccount.annotations" $v.serviceAccount.annotations -}}
{{- range $path := keys $annotationMaps | sortAlpha -}}
{{- range $k, $_ := (get $annotationMaps $path) -}}
{{- if not (include "vllm-lookahead.isQualifiedName" $k) -}}
{{- $errs = append $errs (printf "%s: key %q is not a valid annotation key (optional DNS prefix + \"/\" + a name of up to 63 characters)" $path $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Resources: a request above its limit is rejected; the GPU comes only from server.gpu. */}}
{{- range $path, $res := dict "server.resources" $s.resources "sidecar.resources" $v.sidecar.resources -}}
{{- $req := default dict $res.requests -}}
{{- $lim := default dict $res.limits -}}
{{- range $name := keys $req | sortAlpha -}}
{{- $rq := include "vllm-lookahead.quantityValue" (get $req $name) -}}
{{- if not (regexMatch "[0-9][eE][-+]?[0-9]" (toString (get $req $name))) -}}
{{- if eq $rq "" -}}
{{- $errs = append $errs (printf "%s.requests.%s=%v is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)" $path $name (get $req $name)) -}}
{{- else if hasKey $lim $name -}}
{{- $lq := include "vllm-lookahead.quantityValue" (get $lim $name) -}}
{{- if and (ne $lq "") (gt (float64 $rq) (float64 $lq)) -}}
{{- $errs = append $errs (printf "%s.requests.%s=%v is above %s.limits.%s=%v: Kubernetes requires request <= limit" $path $name (get $req $name) $path $name (get $lim $name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $name := keys $lim | sortAlpha -}}
{{- if and (not (regexMatch "[0-9][eE][-+]?[0-9]" (toString (get $lim $name)))) (eq (include "vllm-lookahead.quantityValue" (get $lim $name)) "") -}}
{{- $errs = append $errs (printf "%s.limits.%s=%v is not a Kubernetes quantity (e.g. 500m, 4, 16Gi)" $path $name (get $lim $name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $res := default dict $s.resources -}}
{{- if or (hasKey (default dict $res.requests) $s.gpu.resourceName) (hasKey (default dict $res.limits) $s.gpu.resourceName) -}}
{{- $errs = append $errs (printf "server.resources sets %s: set server.gpu.count instead (the chart puts the GPU in limits, and a second value would conflict)" $s.gpu.resourceName) -}}
{{- end -}}

{{- /* Tensor parallelism must use exactly the GPUs the pod gets. */}}
{{- $tp := int $v.model.tensorParallelSize -}}
{{- $pp := int (include "vllm-lookahead.intArg" (dict "args" $v.model.extraArgs "flags" (list "--pipeline-parallel-size" "-pp") "default" "1")) -}}
{{- $dp := int (include "vllm-lookahead.intArg" (dict "args" $v.model.extraArgs "flags" (list "--data-parallel-size" "-dp") "default" "1")) -}}
{{- $gpus := int $s.gpu.count -}}
{{- if and (eq $gpus 0) (gt $tp 1) -}}
{{- $errs = append $errs (printf "model.tensorParallelSize=%d needs GPUs, but server.gpu.count=0 (CPU-only): set tensorParallelSize 1 or server.gpu.count >= %d" $tp $tp) -}}
{{- else if and (gt $gpus 0) (ne (mul $tp $pp $dp) $gpus) -}}
{{- $errs = append $errs (printf "model.tensorParallelSize=%d x pipeline %d x data parallel %d = %d GPUs, but server.gpu.count=%d: vLLM %s; make them equal" $tp $pp $dp (mul $tp $pp $dp) $gpus (ternary "fails to start without enough GPUs" "would leave GPUs idle" (gt (mul $tp $pp $dp) $gpus))) -}}
{{- end -}}

{{- /* Rollout: both zero can never progress. */}}
{{- if and (has (toString $s.maxSurge) (list "0" "0%")) (has (toString $s.maxUnavailable) (list "0" "0%")) -}}
{{- $errs = append $errs "server.maxSurge and server.maxUnavailable are both 0: a rollout could never replace a pod (on a node with no spare GPUs use maxSurge 0, maxUnavailable 1)" -}}
{{- end -}}

{{- /* Disruption budgets: one that allows every replica to go is no budget. */}}
{{- $replicas := int (include "vllm-lookahead.serverReplicas" .) -}}
{{- range $path, $p := dict "server.pdb" (dict "pdb" $s.pdb "replicas" $replicas) "sidecar.pdb" (dict "pdb" $v.sidecar.pdb "replicas" (int $v.sidecar.replicaCount)) -}}
{{- if and $p.pdb.enabled (gt $p.replicas 1) (not (kindIs "string" $p.pdb.maxUnavailable)) (ge (int $p.pdb.maxUnavailable) $p.replicas) -}}
{{- $errs = append $errs (printf "%s.maxUnavailable=%d with %d replicas lets a node drain evict every replica at once; use at most %d" $path (int $p.pdb.maxUnavailable) $p.replicas (sub $p.replicas 1)) -}}
{{- end -}}
{{- end -}}

{{- /* Model cache: one ReadWriteOnce volume cannot serve pods on several nodes. */}}
{{- if eq $s.modelCache.type "pvc" -}}
{{- $pods := add $replicas (ternary (int $v.baseline.replicaCount) 0 $v.baseline.enabled) -}}
{{- if and (or (gt $pods 1) $v.hpa.enabled) (not (has "ReadWriteMany" $s.modelCache.accessModes)) -}}
{{- $errs = append $errs (printf "server.modelCache: %d server/baseline pods (or an HPA) share the chart's PVC, which needs accessModes [ReadWriteMany] (got %v); or use type emptyDir (a download per pod) or an existingClaim you know is shared" $pods $s.modelCache.accessModes) -}}
{{- end -}}
{{- if and (has "ReadWriteOncePod" $s.modelCache.accessModes) (not (has (toString $s.maxSurge) (list "0" "0%"))) -}}
{{- $errs = append $errs "server.modelCache.accessModes ReadWriteOncePod with server.maxSurge > 0: the surge pod can never mount the volume; set maxSurge 0 and maxUnavailable 1" -}}
{{- end -}}
{{- end -}}

{{- if $errs -}}
{{- fail (printf "\n%d problem(s) in the values:\n  - %s" (len $errs) (join "\n  - " $errs)) -}}
{{- end -}}
{{- end -}}
